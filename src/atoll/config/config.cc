#include "atoll/config/config.h"

#include <toml++/toml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "atoll/core/errors.h"

namespace atl {
namespace {

// Every key, declared once. `v.num(key, field, help, min, max)` for numbers,
// `v.str(key, field, help, {choices})`, `v.flag(...)` for booleans, `v.list(...)` for lists.
template <class V>
void visit_config(Config& c, V&& v) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  auto& m = c.model;
  v.num("model.vocab_size", m.vocab_size, "V: vocabulary size of the model", 2, 1 << 24);
  v.num("model.dim", m.dim, "C: model width", 1, 1 << 16);
  v.num("model.n_layers", m.n_layers, "L: transformer blocks", 1, 4096);
  v.num("model.n_heads", m.n_heads, "NH: query heads", 1, 4096);
  v.num("model.n_kv_heads", m.n_kv_heads, "NKV: key/value heads (grouped-query attention; divides n_heads)", 1, 4096);
  v.num("model.head_dim", m.head_dim, "HD: head dimension (even, for RoPE)", 2, 4096);
  v.num("model.n_experts", m.n_experts, "E: experts per MoE layer (1 = dense)", 1, 4096);
  v.num("model.top_k", m.top_k, "K: experts per token", 1, 4096);
  v.num("model.expert_hidden", m.expert_hidden, "H: SwiGLU hidden width of each expert", 1, 1 << 20);
  v.num("model.seq_len", m.seq_len, "T: tokens per training sequence", 1, 1 << 20);
  v.num("model.rope_theta", m.rope_theta, "RoPE base", 1.0, kInf);
  v.num("model.norm_eps", m.norm_eps, "RMSNorm epsilon", 0.0, 1.0);
  v.num("model.aux_loss_coef", m.aux_loss_coef, "Switch load-balancing loss coefficient (per layer)", 0.0, kInf);
  v.num("model.z_loss_coef", m.z_loss_coef, "router z-loss coefficient", 0.0, kInf);
  v.flag("model.tie_embeddings", m.tie_embeddings, "LM head shares the embedding table");
  v.num("model.init_std", m.init_std, "standard deviation of the normal init of every matrix", 0.0, kInf);
  v.num("model.init_seed", m.init_seed, "seed of the parameter initialisation", 0, std::numeric_limits<int64_t>::max());
  v.str("model.attention", m.attention, "attention of every block: grouped-query causal attention with RoPE", {"gqa"});
  v.str("model.router", m.router, "router of every MoE block: top-k softmax, renormalised weights", {"topk"});

  auto& t = c.train;
  v.num("train.steps", t.steps, "optimizer steps", 0, std::numeric_limits<int64_t>::max());
  v.num("train.batch_size", t.batch_size, "sequences per optimizer step per worker", 1, 1 << 20);
  v.num("train.micro_batch_size", t.micro_batch_size, "sequences per forward/backward (0 = batch_size); gradients accumulate", 0, 1 << 20);
  v.num("train.batch_ramp_start", t.batch_ramp_start, "sequences per step when the batch-size ramp starts (0 = no ramp)", 0, 1 << 20);
  v.num("train.batch_ramp_tokens", t.batch_ramp_tokens, "tokens over which the batch grows linearly to batch_size", 0, std::numeric_limits<int64_t>::max());
  v.num("train.seed", t.seed, "seed of the data order and sampling", 0, std::numeric_limits<int64_t>::max());
  v.num("train.eval_every", t.eval_every, "steps between validation passes (0 = never)", 0, std::numeric_limits<int64_t>::max());
  v.num("train.eval_batches", t.eval_batches, "batches per validation pass", 1, 1 << 20);
  v.num("train.log_every", t.log_every, "steps between metrics lines", 1, std::numeric_limits<int64_t>::max());
  v.str("train.precision", t.precision, "matrix-product precision", {"fp32", "bf16"});
  v.num("train.threads", t.threads, "worker threads (0 = all cores)", 0, 4096);
  v.str("train.device", t.device, "compute device", {"cpu", "cuda"});

  auto& o = c.optim;
  v.str("optim.name", o.name, "optimizer: adamw, muon (hidden matrices) + adamw (the rest), or sgd (plain, no momentum)",
        {"adamw", "muon", "sgd"});
  v.num("optim.lr", o.lr, "peak learning rate", 0.0, kInf);
  v.num("optim.min_lr_ratio", o.min_lr_ratio, "final learning rate as a fraction of the peak", 0.0, 1.0);
  v.str("optim.schedule", o.schedule, "learning-rate schedule after warmup", {"cosine", "wsd", "constant"});
  v.num("optim.warmup_steps", o.warmup_steps, "linear warmup steps", 0, std::numeric_limits<int64_t>::max());
  v.num("optim.decay_frac", o.decay_frac, "wsd: fraction of the steps spent decaying", 0.0, 1.0);
  v.num("optim.beta1", o.beta1, "AdamW beta1", 0.0, 1.0);
  v.num("optim.beta2", o.beta2, "AdamW beta2", 0.0, 1.0);
  v.num("optim.eps", o.eps, "AdamW epsilon", 0.0, 1.0);
  v.num("optim.weight_decay", o.weight_decay, "decoupled weight decay (matrices only)", 0.0, kInf);
  v.num("optim.grad_clip", o.grad_clip, "global gradient-norm clip (0 = off)", 0.0, kInf);
  v.num("optim.muon_momentum", o.muon_momentum, "Muon Nesterov momentum", 0.0, 1.0);
  v.num("optim.ns_steps", o.ns_steps, "Muon Newton-Schulz iterations", 1, 100);

  auto& d = c.data;
  v.list("data.input", d.input, "text files, folders or JSONL to train on (empty = built-in corpus)");
  v.str("data.dir", d.dir, "folder of prepared shards (empty = cache folder derived from the input)", {});
  v.num("data.vocab_size", d.vocab_size, "tokenizer vocabulary (0 = model.vocab_size)", 0, 1 << 24);
  v.num("data.val_fraction", d.val_fraction, "fraction of the corpus held out for validation", 0.0, 0.5);

  auto& g = c.diloco;
  v.num("diloco.inner_steps", g.inner_steps, "H: inner steps between outer synchronisations", 1, std::numeric_limits<int64_t>::max());
  v.num("diloco.outer_lr", g.outer_lr, "outer Nesterov learning rate", 0.0, kInf);
  v.num("diloco.outer_momentum", g.outer_momentum, "outer Nesterov momentum", 0.0, 1.0);
  v.str("diloco.codec", g.codec, "pseudo-gradient codec", {"fp32", "bf16", "int8", "int4"});
  v.num("diloco.fragments", g.fragments, "streaming fragments (1 = sync everything at once)", 1, 4096);
  v.num("diloco.overlap_steps", g.overlap_steps, "inner steps each fragment exchange overlaps (0 = blocking)", 0, 1 << 20);
  v.num("diloco.mixing", g.mixing, "alpha: after an overlapped exchange local <- alpha*local + (1-alpha)*global (unused when overlap_steps = 0)", 0.0, 1.0);
  v.flag("diloco.error_feedback", g.error_feedback, "carry each island's quantization error into its next outer step");
  v.str("diloco.compress", g.compress, "lossless zstd over the codec's bytes on the wire (int8: ~5% fewer bytes)", {"zstd", "none"});
  v.num("diloco.connections", g.connections, "TCP streams per peer for the outer all-reduce", 1, 64);
  v.num("diloco.chunk_kb", g.chunk_kb, "fp32 KiB per pipelined chunk of the outer all-reduce", 4, 1 << 20);
  v.num("diloco.dp_warmup_steps", g.dp_warmup_steps, "first steps as data parallel across all islands (gradients all-reduced every step), DiLoCo after: a warm start", 0, std::numeric_limits<int64_t>::max());

  v.num("checkpoint.every", c.checkpoint.every, "steps between checkpoints (0 = only at the end)", 0, std::numeric_limits<int64_t>::max());
  v.num("checkpoint.keep", c.checkpoint.keep, "checkpoints kept (newest)", 1, 1 << 20);

  v.num("fault.timeout_s", c.fault.timeout_s, "bound on any wait for a peer or the store, seconds", 0.0, kInf);
  v.num("fault.max_restarts", c.fault.max_restarts, "restarts of one worker by `atoll launch` before the run fails (0 = the first loss ends the run)", 0, 1 << 20);
  v.num("fault.restart_backoff_s", c.fault.restart_backoff_s, "seconds before a lost worker's first restart; doubles with each restart, capped at 60", 0.0, 3600.0);
  v.num("fault.heartbeat_s", c.fault.heartbeat_s, "seconds between a worker's heartbeats in the store", 0.01, 3600.0);
  v.num("fault.heartbeat_ttl_s", c.fault.heartbeat_ttl_s, "seconds a heartbeat lives: a worker silent this long is lost (above fault.heartbeat_s)", 0.02, 86400.0);
}

std::pair<std::string, std::string> split_key(const std::string& key) {
  auto dot = key.find('.');
  return {key.substr(0, dot), key.substr(dot + 1)};
}

std::string fmt_double(double x) {
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  // Shortest text that reads back to the same double (1e-06, not 9.9999999999999995e-07).
  char buf[32];
  const auto res = std::to_chars(buf, buf + sizeof buf, x);
  std::string r(buf, res.ptr);
  if (r.find_first_of(".eEn") == std::string::npos) r += ".0";
  return r;
}

std::string quote(const std::string& s) {
  std::string r = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\') r += '\\';
    r += ch;
  }
  return r + "\"";
}

std::string node_repr(const toml::node& n) {
  std::ostringstream s;
  n.visit([&](auto&& v) {
    if constexpr (toml::is_string<decltype(v)>) s << quote(v.get());
    else if constexpr (toml::is_value<decltype(v)>) s << v.get();
    else if constexpr (toml::is_array<decltype(v)>) s << "a list";
    else s << "a table";
  });
  return s.str();
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// Collects the declared keys and their types.
struct KeyLister {
  std::vector<ConfigKeyInfo> keys;
  template <class N>
  void num(const char* k, N&, const char* help, double, double) {
    keys.push_back({k, std::is_integral_v<N> ? "int" : "float", help});
  }
  void str(const char* k, std::string&, const char* help, std::vector<std::string> choices) {
    std::string h = help;
    if (!choices.empty()) {
      h += " (";
      for (size_t i = 0; i < choices.size(); ++i) h += (i ? " | " : "") + choices[i];
      h += ")";
    }
    keys.push_back({k, "string", h});
  }
  void flag(const char* k, bool&, const char* help) { keys.push_back({k, "bool", help}); }
  void list(const char* k, std::vector<std::string>&, const char* help) { keys.push_back({k, "list", help}); }
};

// Reads declared keys out of a parsed TOML table, with type and range checks.
struct Reader {
  const toml::table& root;
  const std::string& origin;
  const std::map<std::string, std::string>& overridden;  // key -> the --set item that gave it

  const toml::node* find(const char* key) const {
    auto [sec, name] = split_key(key);
    auto* t = root[sec].as_table();
    return t ? t->get(name) : nullptr;
  }
  [[noreturn]] void fail(const char* key, const std::string& problem, const std::string& fix) const {
    auto it = overridden.find(key);  // a value from --set is blamed on --set, not on the file
    throw ConfigError((it == overridden.end() ? origin : "--set " + it->second) + ": " + key + ": " + problem +
                      "; fix: " + fix);
  }

  template <class N>
  void num(const char* key, N& field, const char*, double lo, double hi) {
    const toml::node* n = find(key);
    if (!n) return;
    double value;
    if constexpr (std::is_integral_v<N>) {
      auto* i = n->as_integer();
      if (!i) fail(key, "expected an integer, got " + node_repr(*n), std::string("write a whole number, e.g. ") + key + " = " + std::to_string(field));
      value = static_cast<double>(i->get());
      if (value < lo || value > hi)
        fail(key, "value " + std::to_string(i->get()) + " is out of range",
             "use a value in [" + std::to_string(int64_t(lo)) + ", " + std::to_string(int64_t(hi)) + "]");
      field = static_cast<N>(i->get());
    } else {
      if (auto* i = n->as_integer()) value = static_cast<double>(i->get());
      else if (auto* f = n->as_floating_point()) value = f->get();
      else fail(key, "expected a number, got " + node_repr(*n), std::string("write a number, e.g. ") + key + " = " + fmt_double(field));
      if (!(value >= lo && value <= hi))
        fail(key, "value " + fmt_double(value) + " is out of range", "use a value in [" + fmt_double(lo) + ", " + fmt_double(hi) + "]");
      field = value;
    }
  }
  void str(const char* key, std::string& field, const char*, std::vector<std::string> choices) {
    const toml::node* n = find(key);
    if (!n) return;
    auto* s = n->as_string();
    if (!s) fail(key, "expected a string, got " + node_repr(*n), std::string("quote the value, e.g. ") + key + " = " + quote(field));
    if (!choices.empty() && std::find(choices.begin(), choices.end(), s->get()) == choices.end()) {
      std::string opts;
      for (size_t i = 0; i < choices.size(); ++i) opts += (i ? ", " : "") + choices[i];
      fail(key, "unknown value " + quote(s->get()), "use one of: " + opts);
    }
    field = s->get();
  }
  void flag(const char* key, bool& field, const char*) {
    const toml::node* n = find(key);
    if (!n) return;
    auto* b = n->as_boolean();
    if (!b) fail(key, "expected true or false, got " + node_repr(*n), "write true or false");
    field = b->get();
  }
  void list(const char* key, std::vector<std::string>& field, const char*) {
    const toml::node* n = find(key);
    if (!n) return;
    field.clear();
    if (auto* s = n->as_string()) {  // "a,b" from --set
      std::stringstream ss(s->get());
      std::string item;
      while (std::getline(ss, item, ',')) if (!item.empty()) field.push_back(item);
      return;
    }
    auto* a = n->as_array();
    if (!a) fail(key, "expected a list of strings, got " + node_repr(*n), std::string("write e.g. ") + key + " = [\"a.txt\", \"texts/\"]");
    for (auto& e : *a) {
      auto* s = e.as_string();
      if (!s) fail(key, "list item " + node_repr(e) + " is not a string", "quote every item");
      field.push_back(s->get());
    }
  }
};

// Writes every key as TOML, section by section in declaration order.
struct Writer {
  std::string section;
  std::ostringstream out;
  void key(const char* k, const std::string& value) {
    auto [sec, name] = split_key(k);
    if (sec != section) {
      out << (section.empty() ? "" : "\n") << "[" << sec << "]\n";
      section = sec;
    }
    out << name << " = " << value << "\n";
  }
  template <class N>
  void num(const char* k, N& f, const char*, double, double) {
    if constexpr (std::is_integral_v<N>) key(k, std::to_string(f));
    else key(k, fmt_double(f));
  }
  void str(const char* k, std::string& f, const char*, std::vector<std::string>) { key(k, quote(f)); }
  void flag(const char* k, bool& f, const char*) { key(k, f ? "true" : "false"); }
  void list(const char* k, std::vector<std::string>& f, const char*) {
    std::string s = "[";
    for (size_t i = 0; i < f.size(); ++i) s += (i ? ", " : "") + quote(f[i]);
    key(k, s + "]");
  }
};

std::set<std::string> known_keys() {
  std::set<std::string> keys;
  for (auto& k : config_keys()) keys.insert(k.key);
  return keys;
}

[[noreturn]] void unknown_key(const std::string& origin, const std::string& key) {
  std::string best;
  size_t best_d = 4;
  for (auto& k : known_keys()) {
    size_t d = edit_distance(key, k);
    if (d < best_d) best_d = d, best = k;
  }
  throw ConfigError(origin + ": unknown key '" + key + "'" + (best.empty() ? "" : "; did you mean '" + best + "'?") +
                    " (fix: remove it or use a key listed by `atoll train --help-config`)");
}

void check_unknown_keys(const toml::table& root, const std::string& origin) {
  auto known = known_keys();
  std::set<std::string> sections;
  for (auto& k : known) sections.insert(split_key(k).first);
  for (auto& [sec, node] : root) {
    std::string s(sec.str());
    if (!sections.count(s)) {
      if (!node.is_table()) unknown_key(origin, s);
      throw ConfigError(origin + ": unknown section [" + s + "] (fix: use one of [model] [train] [optim] [data] [diloco] [checkpoint] [fault])");
    }
    auto* t = node.as_table();
    if (!t) throw ConfigError(origin + ": '" + s + "' must be a section ([" + s + "]), not a value");
    for (auto& [name, _] : *t) {
      std::string full = s + "." + std::string(name.str());
      if (!known.count(full)) unknown_key(origin, full);
    }
  }
}

void apply_override(toml::table& root, const std::string& item) {
  const std::string origin = "--set " + item;
  auto eq = item.find('=');
  if (eq == std::string::npos || eq == 0)
    throw ConfigError(origin + ": expected key=value (fix: e.g. --set train.steps=100)");
  std::string key = item.substr(0, eq), value = item.substr(eq + 1);
  if (!known_keys().count(key)) unknown_key(origin, key);
  // The value is TOML when it parses as TOML (numbers, booleans, quoted strings, arrays),
  // otherwise a bare string, so `--set optim.name=muon` works without quotes.
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + value);
  } catch (const toml::parse_error&) {
    parsed.insert_or_assign("v", value);
  }
  auto [sec, name] = split_key(key);
  if (!root.contains(sec)) root.insert(sec, toml::table{});
  auto* t = root[sec].as_table();
  if (!t) throw ConfigError(origin + ": '" + sec + "' is not a section in the config file");
  t->insert_or_assign(name, *parsed.get("v"));
}

}  // namespace

std::vector<ConfigKeyInfo> config_keys() {
  Config c;
  KeyLister l;
  visit_config(c, l);
  return l.keys;
}

Config parse_config(const std::string& text, const std::string& origin, const std::vector<std::string>& overrides) {
  toml::table root;
  try {
    root = toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    const auto& src = e.source();
    throw ConfigError(origin + ":" + std::to_string(src.begin.line) + ":" + std::to_string(src.begin.column) +
                      ": not valid TOML: " + std::string(e.description()) + " (fix: correct the syntax at that line)");
  }
  check_unknown_keys(root, origin);
  std::map<std::string, std::string> overridden;
  for (auto& item : overrides) {
    apply_override(root, item);
    overridden[item.substr(0, item.find('='))] = item;
  }
  Config c;
  Reader r{root, origin, overridden};
  visit_config(c, r);
  std::string where = origin;  // cross-field errors may come from the file or from --set
  for (auto& item : overrides) where += (&item == &overrides.front() ? " with --set " : ", --set ") + item;
  validate_config(c, where);
  return c;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  if (path.empty()) return parse_config("", "default config", overrides);
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))  // would read as empty, i.e. silently the defaults
    throw ConfigError(path + ": is a folder, not a config file (fix: pass a .toml file to --config)");
  std::ifstream f(path);
  if (!f) throw ConfigError(path + ": cannot open config file (fix: check the path given to --config)");
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_config(ss.str(), path, overrides);
}

void validate_config(const Config& c, const std::string& origin) {
  auto fail = [&](const std::string& msg) { throw ConfigError(origin + ": " + msg); };
  const auto& m = c.model;
  if (m.n_heads % m.n_kv_heads != 0)
    fail("model.n_kv_heads (" + std::to_string(m.n_kv_heads) + ") must divide model.n_heads (" + std::to_string(m.n_heads) + "); fix: change one of them");
  if (m.head_dim % 2 != 0) fail("model.head_dim must be even for RoPE; fix: use an even head_dim");
  if (m.top_k > m.n_experts)
    fail("model.top_k (" + std::to_string(m.top_k) + ") exceeds model.n_experts (" + std::to_string(m.n_experts) + "); fix: lower top_k or add experts");
  const auto& t = c.train;
  int micro = t.micro_batch_size ? t.micro_batch_size : t.batch_size;
  if (t.batch_size % micro != 0)
    fail("train.micro_batch_size (" + std::to_string(micro) + ") must divide train.batch_size (" + std::to_string(t.batch_size) + "); fix: change one of them");
  if (t.batch_ramp_start > t.batch_size)
    fail("train.batch_ramp_start exceeds train.batch_size; fix: start the ramp at or below the target batch");
  const auto& f = c.fault;
  if (!(f.heartbeat_ttl_s > f.heartbeat_s))
    fail("fault.heartbeat_ttl_s (" + fmt_double(f.heartbeat_ttl_s) + ") must exceed fault.heartbeat_s (" +
         fmt_double(f.heartbeat_s) + "), or a live worker's heartbeat expires between two refreshes; fix: raise "
         "fault.heartbeat_ttl_s to a few heartbeats (e.g. 5 x fault.heartbeat_s)");
  if (c.data.vocab_size > m.vocab_size)
    fail("data.vocab_size (" + std::to_string(c.data.vocab_size) + ") exceeds model.vocab_size (" + std::to_string(m.vocab_size) + "); fix: lower data.vocab_size or raise model.vocab_size");
}

std::string config_to_toml(const Config& cfg) {
  Config c = cfg;
  Writer w;
  visit_config(c, w);
  return w.out.str();
}

std::string model_config_to_toml(const ModelConfig& m) {
  Config c;
  c.model = m;
  std::string all = config_to_toml(c);
  return all.substr(0, all.find("\n[train]")) + "\n";
}

}  // namespace atl
