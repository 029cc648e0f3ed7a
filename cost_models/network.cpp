// The [network] section of a device profile and the time of one collective.
//
// Format (profiles/README.md):
//   [network]
//   gpus_per_node = 8
//   [network.intra_node]                 # NVLink / NVSwitch
//   name = "NVLink 3 / NVSwitch"
//   bus_bandwidth = 230e9                # bytes/s per GPU: achieved NCCL busbw
//   link_bandwidth = 300e9               # bytes/s per GPU per direction (datasheet)
//   latency_s = 3.4e-6                   # ring Simple step latency (NCCL's model)
//   [[network.intra_node.collectives]]   # optional measured table (nccl-tests)
//   kind = "all_reduce"
//   ranks = 8
//   sizes_bytes = [1e6, 1e8]
//   times_s = [6e-5, 9e-4]
//   [network.inter_node] ...             # InfiniBand / RoCE, same keys
#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <sstream>

#include "modar/base/enum_names.hpp"
#include "modar/base/errors.hpp"
#include "modar/base/json.hpp"
#include "modar/base/text.hpp"
#include "modar/parallel.hpp"
#include "profile_sections.hpp"
#include "toml_text.hpp"

namespace modar {

constexpr const char* kCollectiveNames[] = {"all_reduce", "reduce_scatter", "all_gather",
                                            "all_to_all", "send_recv"};
static_assert(std::size(kCollectiveNames) == kCollectiveCount);
const char* to_string(Collective v) {
  return name_of(kCollectiveNames, v);
}

bool parse_collective(const std::string& name, Collective* kind) {
  const std::optional<Collective> named = enum_named<Collective>(kCollectiveNames, name);
  if (named) {
    *kind = *named;
  }
  return named.has_value();
}

const char* to_string(NetLevel level) {
  return level == NetLevel::intra_node ? "intra_node" : "inter_node";
}

double collective_bus_factor(Collective kind, int64_t ranks) {
  if (ranks <= 1) {
    return 0.0;
  }
  const double p = static_cast<double>(ranks);
  switch (kind) {
    case Collective::all_reduce:
      return 2.0 * (p - 1.0) / p;
    case Collective::reduce_scatter:
    case Collective::all_gather:
    case Collective::all_to_all:
      return (p - 1.0) / p;
    case Collective::send_recv:
      return 1.0;
  }
  return 0.0;
}

namespace {

// Latency steps of the plain formula: a tree-like ceil(log2 p), twice for
// all-reduce, one for send / recv.
double latency_steps(Collective kind, int64_t ranks) {
  if (kind == Collective::send_recv) {
    return 1.0;
  }
  const double steps = std::ceil(std::log2(static_cast<double>(ranks)));
  return kind == Collective::all_reduce ? 2.0 * steps : steps;
}

// log-log interpolation of a measured table; false outside its range.
bool table_time_s(const CollectiveTable& table, double bytes, double* seconds) {
  const std::vector<double>& x = table.sizes_bytes;
  if (x.empty() || bytes < x.front() || bytes > x.back()) {
    return false;
  }
  if (x.size() == 1) {
    *seconds = table.times_s.front();
    return true;
  }
  const size_t hi = static_cast<size_t>(std::upper_bound(x.begin(), x.end(), bytes) - x.begin());
  const size_t upper = std::min(std::max<size_t>(hi, 1), x.size() - 1);
  const size_t lower = upper - 1;
  const double t = (std::log(bytes) - std::log(x[lower])) / (std::log(x[upper]) - std::log(x[lower]));
  *seconds = std::exp(std::log(table.times_s[lower]) +
                      t * (std::log(table.times_s[upper]) - std::log(table.times_s[lower])));
  return true;
}

}  // namespace

double collective_time_s(const NetworkProfile& network, Collective kind, double bytes,
                         int64_t ranks, NetLevel level, int64_t members_per_node,
                         const CollectiveEfficiency& efficiency) {
  if (ranks <= 1 || bytes <= 0.0) {
    return 0.0;
  }
  const NetworkLevel& net = level == NetLevel::intra_node ? network.intra_node : network.inter_node;
  const double nics =
      level == NetLevel::inter_node ? static_cast<double>(std::max<int64_t>(1, members_per_node))
                                    : 1.0;
  // The measured table of this kind whose group size is nearest to `ranks`
  // (in log2; an exact match, else the larger of two equally near) among
  // those covering `bytes` (modar profile --comm writes one per group size).
  const CollectiveTable* nearest = nullptr;
  double nearest_time_s = 0.0;
  double nearest_distance = 0.0;
  for (const CollectiveTable& table : net.tables) {
    double measured = 0.0;
    if (table.kind != kind || !table_time_s(table, bytes, &measured)) {
      continue;
    }
    const double distance = std::fabs(std::log2(static_cast<double>(table.ranks)) -
                                      std::log2(static_cast<double>(ranks)));
    if (nearest == nullptr || distance < nearest_distance ||
        (distance == nearest_distance && table.ranks > nearest->ranks)) {
      nearest = &table;
      nearest_time_s = measured;
      nearest_distance = distance;
    }
  }
  if (nearest != nullptr) {
    // Same bus bandwidth at another group size: rescale by the bus factor.
    const double factor = collective_bus_factor(kind, ranks);
    const double table_factor = collective_bus_factor(kind, nearest->ranks);
    return (table_factor > 0.0 ? nearest_time_s * factor / table_factor : nearest_time_s) / nics;
  }
  double bandwidth = net.bus_bandwidth > 0.0 ? net.bus_bandwidth : 1.0;
  if (level == NetLevel::inter_node) {
    bandwidth *= nics * efficiency.inter_node;
    if (network.intra_node.bus_bandwidth > 0.0) {
      bandwidth = std::min(bandwidth, network.intra_node.bus_bandwidth * efficiency.intra_node);
    }
  } else {
    bandwidth *= efficiency.intra_node;
  }
  if (!efficiency.nccl_protocols) {
    return net.latency_s * latency_steps(kind, ranks) +
           collective_bus_factor(kind, ranks) * bytes / bandwidth;
  }
  // NCCL's own cost model over the nodes the group spans (collective_model.cpp).
  const int64_t per_node = std::max<int64_t>(1, members_per_node);
  const int64_t nodes = level == NetLevel::inter_node ? (ranks + per_node - 1) / per_node : 1;
  return nccl_collective_time_s(kind, bytes, ranks, nodes, bandwidth, network.intra_node.latency_s,
                                network.inter_node.latency_s);
}

const NetworkProfile& network_or_default(const DeviceProfile& profile) {
  if (profile.network.present) {
    return profile.network;
  }
  // No [network]: an HGX-class node (NVLink 4 busbw ~370 GB/s, one 400 Gb/s
  // NIC per GPU at ~40 GB/s busbw; NCCL's step latencies); see docs/cluster.md.
  static const NetworkProfile fallback = [] {
    NetworkProfile n;
    n.present = false;
    n.gpus_per_node = 8;
    n.intra_node.name = "NVLink (default, not measured)";
    n.intra_node.bus_bandwidth = 370e9;
    n.intra_node.link_bandwidth = 450e9;
    n.intra_node.latency_s = 3.4e-6;
    n.inter_node.name = "400 Gb/s InfiniBand (default, not measured)";
    n.inter_node.bus_bandwidth = 40e9;
    n.inter_node.link_bandwidth = 50e9;
    n.inter_node.latency_s = 9.6e-6;
    return n;
  }();
  return fallback;
}

namespace detail {

namespace {

[[noreturn]] void fail_network(const std::string& source, const std::string& field,
                               const std::string& value, const std::string& allowed) {
  throw ConfigError(source + ": " + field + " = " + value + ": " + allowed);
}

double network_number(const toml::node& node, const std::string& source,
                      const std::string& field) {
  const std::optional<double> value = toml_number(node);
  if (!value) {
    fail_network(source, field, toml_node_text(node), "must be a number");
  }
  if (!std::isfinite(*value)) {
    fail_network(source, field, format_number(*value), "must be a finite number");
  }
  return *value;
}

std::vector<double> number_array(const toml::table& table, const char* key,
                                 const std::string& source, const std::string& field) {
  const toml::array* array = table[key].as_array();
  if (array == nullptr || array->empty()) {
    throw ConfigError(source + ": " + field + " is missing or empty (required: an array of "
                                              "numbers > 0)");
  }
  std::vector<double> out;
  for (size_t i = 0; i < array->size(); ++i) {
    const std::string where = field + "[" + std::to_string(i) + "]";
    const double v = network_number(*array->get(i), source, where);
    if (v <= 0.0) {
      fail_network(source, where, format_number(v), "must be > 0");
    }
    out.push_back(v);
  }
  return out;
}

void parse_level(const toml::table& table, const std::string& source, const std::string& prefix,
                 NetworkLevel& level) {
  static const char* const kKnown[] = {"name", "bus_bandwidth", "link_bandwidth", "latency_s",
                                       "collectives"};
  for (const auto& [key, node] : table) {
    bool known = false;
    for (const char* name : kKnown) {
      known = known || key.str() == name;
    }
    if (!known) {
      throw ConfigError(source + ": unknown key '" + prefix + std::string(key.str()) +
                        "'; allowed: name, bus_bandwidth, link_bandwidth, latency_s, "
                        "[[collectives]]");
    }
  }
  if (const toml::node* name = table.get("name")) {
    if (!name->is_string()) {
      fail_network(source, prefix + "name", toml_node_text(*name), "must be a string");
    }
    level.name = name->as_string()->get();
  }
  const toml::node* bus = table.get("bus_bandwidth");
  if (bus == nullptr) {
    throw ConfigError(source + ": " + prefix + "bus_bandwidth is missing (required, bytes/s)");
  }
  level.bus_bandwidth = network_number(*bus, source, prefix + "bus_bandwidth");
  if (level.bus_bandwidth <= 0.0) {
    fail_network(source, prefix + "bus_bandwidth", format_number(level.bus_bandwidth),
                 "must be > 0 (bytes/s)");
  }
  if (const toml::node* link = table.get("link_bandwidth")) {
    level.link_bandwidth = network_number(*link, source, prefix + "link_bandwidth");
    if (level.link_bandwidth < 0.0) {
      fail_network(source, prefix + "link_bandwidth", format_number(level.link_bandwidth),
                   "must be >= 0 (bytes/s)");
    }
  }
  if (const toml::node* latency = table.get("latency_s")) {
    level.latency_s = network_number(*latency, source, prefix + "latency_s");
    if (level.latency_s < 0.0) {
      fail_network(source, prefix + "latency_s", format_number(level.latency_s),
                   "must be >= 0 (seconds)");
    }
  }
  if (const toml::node* list = table.get("collectives")) {
    const toml::array* array = list->as_array();
    if (array == nullptr) {
      fail_network(source, prefix + "collectives", "a value",
                   "must be an array of tables [[" + prefix + "collectives]]");
    }
    for (size_t i = 0; i < array->size(); ++i) {
      const std::string where = prefix + "collectives[" + std::to_string(i) + "].";
      const toml::table* entry = array->get(i)->as_table();
      if (entry == nullptr) {
        fail_network(source, where, "a value", "must be a table");
      }
      CollectiveTable t;
      const toml::node* kind = entry->get("kind");
      const std::string kind_name =
          kind != nullptr && kind->is_string() ? kind->as_string()->get() : std::string();
      if (!parse_collective(kind_name, &t.kind)) {
        fail_network(source, where + "kind", "\"" + kind_name + "\"",
                     "must be \"all_reduce\", \"reduce_scatter\", \"all_gather\", "
                     "\"all_to_all\" or \"send_recv\"");
      }
      const toml::node* ranks = entry->get("ranks");
      if (ranks == nullptr || !ranks->is_integer() || ranks->as_integer()->get() < 2 ||
          ranks->as_integer()->get() > (int64_t{1} << 20)) {
        fail_network(source, where + "ranks", ranks ? toml_node_text(*ranks) : "missing",
                     "must be an integer in [2, 1048576]");
      }
      t.ranks = ranks->as_integer()->get();
      t.sizes_bytes = number_array(*entry, "sizes_bytes", source, where + "sizes_bytes");
      t.times_s = number_array(*entry, "times_s", source, where + "times_s");
      if (t.sizes_bytes.size() != t.times_s.size()) {
        fail_network(source, where + "times_s", std::to_string(t.times_s.size()) + " values",
                     "must have one time per size (" + std::to_string(t.sizes_bytes.size()) +
                         ")");
      }
      for (size_t j = 1; j < t.sizes_bytes.size(); ++j) {
        if (!(t.sizes_bytes[j] > t.sizes_bytes[j - 1])) {
          fail_network(source, where + "sizes_bytes", format_number(t.sizes_bytes[j]),
                       "must be strictly ascending");
        }
      }
      level.tables.push_back(std::move(t));
    }
  }
}

}  // namespace

void parse_network_section(const toml::table& root, const std::string& source,
                           NetworkProfile& network) {
  const toml::table* table = optional_section_table(root, "network", source);
  if (table == nullptr) {
    return;
  }
  network.present = true;
  for (const auto& [key, value] : *table) {
    const std::string name(key.str());
    if (name != "gpus_per_node" && name != "intra_node" && name != "inter_node") {
      throw ConfigError(source + ": unknown key 'network." + name +
                        "'; allowed: gpus_per_node, [network.intra_node], [network.inter_node]");
    }
  }
  if (const toml::node* gpn = table->get("gpus_per_node")) {
    if (!gpn->is_integer() || gpn->as_integer()->get() < 1 ||
        gpn->as_integer()->get() > 1024) {
      fail_network(source, "network.gpus_per_node", toml_node_text(*gpn),
                   "must be an integer in [1, 1024]");
    }
    network.gpus_per_node = gpn->as_integer()->get();
  }
  const char* const levels[] = {"intra_node", "inter_node"};
  for (const char* level_name : levels) {
    const toml::table* level = (*table)[level_name].as_table();
    if (level == nullptr) {
      throw ConfigError(source + ": [network." + std::string(level_name) +
                        "] is missing (required when [network] is present)");
    }
    parse_level(*level, source, "network." + std::string(level_name) + ".",
                std::string(level_name) == "intra_node" ? network.intra_node
                                                        : network.inter_node);
  }
}

std::string network_to_toml(const NetworkProfile& network) {
  if (!network.present) {
    return std::string();
  }
  std::ostringstream out;
  out << "\n[network]\ngpus_per_node = " << network.gpus_per_node << "\n";
  const std::pair<const char*, const NetworkLevel*> levels[] = {
      {"intra_node", &network.intra_node}, {"inter_node", &network.inter_node}};
  for (const auto& [name, level] : levels) {
    out << "\n[network." << name << "]\n";
    out << "name = " << toml_quote(level->name) << "\n";
    out << "bus_bandwidth = " << toml_float_literal(level->bus_bandwidth) << "\n";
    out << "link_bandwidth = " << toml_float_literal(level->link_bandwidth) << "\n";
    out << "latency_s = " << toml_float_literal(level->latency_s) << "\n";
    for (const CollectiveTable& t : level->tables) {
      out << "\n[[network." << name << ".collectives]]\n";
      out << "kind = \"" << to_string(t.kind) << "\"\nranks = " << t.ranks << "\n";
      out << "sizes_bytes = [";
      for (size_t i = 0; i < t.sizes_bytes.size(); ++i) {
        out << (i ? ", " : "") << toml_float_literal(t.sizes_bytes[i]);
      }
      out << "]\ntimes_s = [";
      for (size_t i = 0; i < t.times_s.size(); ++i) {
        out << (i ? ", " : "") << toml_float_literal(t.times_s[i]);
      }
      out << "]\n";
    }
  }
  return out.str();
}

}  // namespace detail
}  // namespace modar
