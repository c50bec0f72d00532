#include "atoll/config/data_mix.h"

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
      if (name.str() != "at_tokens" && name.str() != "mix")
        raise(fail, at + "." + std::string(name.str()), "unknown key", "a phase holds at_tokens and mix");
    DataPhase phase;
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
  for (size_t i = 0; i < phases.size(); ++i)
    s += (i ? ", " : "") + std::string("{at_tokens = ") + std::to_string(phases[i].at_tokens) +
         ", mix = " + data_mix_toml(phases[i].mix) + "}";
  return s + "]";
}

std::vector<DataPhase> data_phases(const DataConfig& d) {
  if (!d.phases.empty()) return d.phases;
  if (!d.mix.empty()) return {DataPhase{.at_tokens = 0, .mix = d.mix}};
  return {};
}

}  // namespace atl
