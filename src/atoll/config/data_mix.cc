#include "atoll/config/data_mix.h"

#include <algorithm>
#include <cmath>

#include "atoll/config/toml_text.h"
#include "atoll/core/errors.h"

namespace atl {
namespace {

[[noreturn]] void raise(const ConfigFail& fail, const std::string& key, const std::string& problem, const std::string& fix) {
  fail(key, problem, fix);
  throw ConfigError(key + ": " + problem + "; fix: " + fix);  // a ConfigFail that did not throw
}

bool empty_list(const toml::node& n) { return n.as_array() && n.as_array()->empty(); }

// A whole number in [lo, hi] at `key`, or the failure naming it.
int read_int(const toml::node& n, const std::string& key, int lo, int hi, const ConfigFail& fail) {
  auto* v = n.as_integer();
  if (!v || v->get() < lo || v->get() > hi)
    raise(fail, key, "expected a whole number in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + node_repr(n),
          "write e.g. " + key + " = " + std::to_string(std::max(lo, 2048)));
  return int(v->get());
}

// What a phase sets beside its mixture: `model = {seq_len, rope_theta}` and `train =
// {batch_size}` (TOML's dotted keys model.seq_len = ... inside the phase's table read the same).
void read_phase_settings(const toml::table& t, const std::string& at, const ConfigFail& fail, DataPhase& phase) {
  const std::string allowed = std::string("a phase may set ") + kPhaseKeysText;
  for (const char* section : {"model", "train"}) {
    const toml::node* n = t.get(section);
    if (!n) continue;
    auto* sub = n->as_table();
    if (!sub) raise(fail, at + "." + section, "expected keys such as " + at + "." + section + ".seq_len", allowed);
    for (auto& [name, value] : *sub) {
      const std::string key = std::string(section) + "." + std::string(name.str());
      const std::string full = at + "." + key;
      if (key == "model.seq_len") {
        phase.seq_len = read_int(value, full, 1, 1 << 20, fail);
      } else if (key == "train.batch_size") {
        phase.batch_size = read_int(value, full, 1, 1 << 20, fail);
      } else if (key == "model.rope_theta") {
        const double theta = value.as_integer()          ? double(value.as_integer()->get())
                             : value.as_floating_point() ? value.as_floating_point()->get()
                                                         : std::nan("");
        if (!(std::isfinite(theta) && theta >= 1))
          raise(fail, full, "expected a number >= 1, got " + node_repr(value), "write e.g. " + full + " = 1000000.0");
        phase.rope_theta = theta;
      } else {
        raise(fail, full, "a phase cannot set " + key, allowed + "; other keys hold for the whole run");
      }
    }
  }
}

}  // namespace

std::vector<MixSource> read_data_mix(const toml::node& n, const std::string& key, const ConfigFail& fail) {
  if (empty_list(n) && key.find('[') == std::string::npos) return {};  // data.mix = [] (a phase's mix may not be empty)
  const std::string example = "write e.g. " + key + " = [{dir = \"data/web\", weight = 0.7}, {dir = \"data/code\", weight = 0.3}]";
  auto* a = n.as_array();
  if (!a || a->empty()) raise(fail, key, "expected a non-empty list of tables, got " + node_repr(n), example);
  std::vector<MixSource> mix;
  for (size_t i = 0; i < a->size(); ++i) {
    const std::string at = key + "[" + std::to_string(i) + "]";
    auto* t = a->get(i)->as_table();
    if (!t) raise(fail, at, "expected a table {dir = ..., weight = ...}, got " + node_repr(*a->get(i)), example);
    for (auto& [name, _] : *t)
      if (name.str() != "dir" && name.str() != "weight")
        raise(fail, at + "." + std::string(name.str()), "unknown key", "a mixture entry holds dir and weight");
    auto* dir = t->get("dir") ? t->get("dir")->as_string() : nullptr;
    if (!dir || dir->get().empty()) raise(fail, at + ".dir", "expected the folder of a prepared dataset", example);
    const toml::node* w = t->get("weight");
    // A weight may be left out only where it means nothing (a mixture of one dataset): beside
    // others, a silent 1 would be weighed against weights that may sum to 1.
    if (!w && a->size() > 1)
      raise(fail, at + ".weight", "no weight given for \"" + dir->get() + "\" in a mixture of " +
                                      std::to_string(a->size()) + " datasets", example);
    const double weight = !w                    ? 1.0
                          : w->as_integer()        ? double(w->as_integer()->get())
                          : w->as_floating_point() ? w->as_floating_point()->get()
                                                   : std::nan("");
    if (!(std::isfinite(weight) && weight > 0))
      raise(fail, at + ".weight", "weight " + node_repr(*w) + " is not a number > 0",
            "give every dataset a positive weight, or leave it out of the mixture");
    for (const MixSource& s : mix)
      if (s.dir == dir->get()) raise(fail, at + ".dir", "\"" + s.dir + "\" is listed twice", "list each dataset once");
    mix.push_back({dir->get(), weight});
  }
  return mix;
}

std::vector<DataPhase> read_data_phases(const toml::node& n, const std::string& key, const ConfigFail& fail) {
  if (empty_list(n)) return {};
  std::vector<DataPhase> phases;
  const std::string example = "write e.g. " + key +
                              " = [{at_tokens = 0, mix = [{dir = \"web\", weight = 1}]}, {at_tokens = 2000000, mix = "
                              "[{dir = \"web\", weight = 0.5}, {dir = \"code\", weight = 0.5}]}]";
  auto* a = n.as_array();
  if (!a || a->empty()) raise(fail, key, "expected a non-empty list of tables, got " + node_repr(n), example);
  for (size_t i = 0; i < a->size(); ++i) {
    const std::string at = key + "[" + std::to_string(i) + "]";
    auto* t = a->get(i)->as_table();
    if (!t) raise(fail, at, "expected a table {at_tokens = ..., mix = [...]}, got " + node_repr(*a->get(i)), example);
    for (auto& [name, _] : *t)
      if (name.str() != "at_tokens" && name.str() != "mix" && name.str() != "model" && name.str() != "train")
        raise(fail, at + "." + std::string(name.str()), "unknown key",
              std::string("a phase holds at_tokens, mix and optionally ") + kPhaseKeysText);
    DataPhase phase;
    read_phase_settings(*t, at, fail, phase);
    auto* tokens = t->get("at_tokens") ? t->get("at_tokens")->as_integer() : nullptr;
    if (!tokens || tokens->get() < 0) raise(fail, at + ".at_tokens", "expected a whole number >= 0", example);
    phase.at_tokens = tokens->get();
    if (i == 0 && phase.at_tokens != 0) raise(fail, at + ".at_tokens", "the first phase must start at 0", "set it to 0");
    if (i > 0 && phase.at_tokens <= phases.back().at_tokens)
      raise(fail, at + ".at_tokens", "phases must start at increasing token counts", "order the phases by at_tokens");
    if (!t->get("mix")) raise(fail, at + ".mix", "missing", example);
    phase.mix = read_data_mix(*t->get("mix"), at + ".mix", fail);
    phases.push_back(std::move(phase));
  }
  return phases;
}

std::string data_mix_toml(const std::vector<MixSource>& mix) {
  std::string s = "[";
  for (size_t i = 0; i < mix.size(); ++i)
    s += (i ? ", " : "") + std::string("{dir = ") + quote(mix[i].dir) + ", weight = " + fmt_double(mix[i].weight) + "}";
  return s + "]";
}

std::string data_phases_toml(const std::vector<DataPhase>& phases) {
  std::string s = "[";
  for (size_t i = 0; i < phases.size(); ++i) {
    const DataPhase& p = phases[i];
    s += (i ? ", " : "") + std::string("{at_tokens = ") + std::to_string(p.at_tokens) + ", mix = " + data_mix_toml(p.mix);
    if (p.seq_len) s += ", model.seq_len = " + std::to_string(p.seq_len);
    if (p.rope_theta != 0) s += ", model.rope_theta = " + fmt_double(p.rope_theta);
    if (p.batch_size) s += ", train.batch_size = " + std::to_string(p.batch_size);
    s += "}";
  }
  return s + "]";
}

std::vector<DataPhase> data_phases(const DataConfig& d) {
  if (!d.phases.empty()) return d.phases;
  if (!d.mix.empty()) return {DataPhase{.at_tokens = 0, .mix = d.mix}};
  return {};
}

Config config_in_phase(const Config& c, const DataPhase& phase) {
  Config in = c;
  if (phase.seq_len) in.model.seq_len = phase.seq_len;
  if (phase.rope_theta != 0) in.model.rope_theta = phase.rope_theta;
  if (phase.batch_size) in.train.batch_size = phase.batch_size;
  return in;
}

Config config_at_tokens(const Config& c, int64_t tokens) {
  const std::vector<DataPhase> phases = data_phases(c.data);
  const DataPhase* at = nullptr;
  for (const DataPhase& p : phases)
    if (p.at_tokens <= tokens) at = &p;
  return at ? config_in_phase(c, *at) : c;
}

}  // namespace atl
