// Import of a Hugging Face checkpoint folder (`atoll train --init-from DIR`, docs/weights.md):
// config.json, model.safetensors or shards named by model.safetensors.index.json, and the
// SentencePiece tokenizer.model. The tensors are mapped by the tables the export writes by
// (ckpt/hf_tables.h), so HF -> atoll -> HF gives the same tensors.
//
// Architectures: MixtralForCausalLM, Qwen3MoeForCausalLM (model.qk_norm "head"),
// OlmoeForCausalLM (model.qk_norm "proj") and Qwen2MoeForCausalLM (a gated shared expert and q/k/v
// biases), each per-expert or transformers v5's fused experts;
// ZayaForCausalLM (ckpt/export_zaya.h's table, read back) and LlamaForCausalLM /
// MistralForCausalLM (one expert, top-1: a dense model stays dense); Qwen2MoeForCausalLM
// (model.shared_expert_hidden, model.qkv_bias). Other architectures are refused. Every
// config.json field is either mapped exactly or
// refused naming the field, its value and why; fields that change nothing the weights compute
// (ids, dtype, cache...) are listed.
//
// Everything is checked before the caller writes anything: the folder's files (an index naming
// a file outside the folder, by "..", an absolute path or a symbolic link, is refused), each
// safetensors file whole (ckpt/safetensors.h), each tensor's presence, dtype (BF16, F16, F32)
// and shape. Errors are ConfigError (config.json) or CorruptCheckpoint / IoError naming the file
// and the tensor.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "atoll/ckpt/hf_tables.h"
#include "atoll/model/model_config.h"
#include "nlohmann/json.hpp"

namespace atl {

struct HfSource {
  std::string dir;                // as given
  std::string architecture;       // "MixtralForCausalLM", ...
  ModelConfig model;              // `base` with every key config.json sets replaced
  HfExpertLayout layout = HfExpertLayout::kPerExpert;
  std::vector<std::string> weight_files;  // the safetensors files, in the folder
  std::string tokenizer_path;             // DIR/tokenizer.model
  std::vector<std::string> ignored;       // config.json fields that change no weight's meaning
};

// Reads DIR/config.json into `base`'s [model] (keys config.json does not set, such as
// init_std or z_loss_coef, stay `base`'s; model.seq_len is the training context, kept, and must
// not exceed max_position_embeddings) and finds the folder's files. Throws ConfigError for an
// unknown model_type or architecture, a field atoll cannot map (named with its value and why),
// a folder without tokenizer.model (the fix for tokenizer.json-only folders), a missing index or
// shard, or an index naming a file outside the folder.
HfSource read_hf_source(const std::string& dir, const ModelConfig& base);

// Upcycling a dense source (Llama, Mistral: layout kDense) to `experts` experts, `top_k` per token:
// src.model gets them, and import_hf_weights copies the dense MLP into every expert with a zero
// router (uniform probabilities; with renormalised top-k weights the K identical experts sum to
// the dense MLP, so the upcycled model computes the dense one's function at the start). Throws
// ConfigError for a source with experts of its own, or top_k outside [1, experts].
void upcycle_hf_source(HfSource& src, int experts, int top_k);

// The weights of `src` into `params` (laid out by ParamLayout::build(src.model), fp32, every
// element written): each tensor's header checked, BF16 / F16 / F32 converted. With `params` null
// only checks (every header, tensor and checksum, nothing converted). Returns the
// init_from event's fields: the source, each file's xxh3 (16 hex digits of its bytes, as the
// checkpoints' manifests), the layout and the tensors mapped.
nlohmann::json import_hf_weights(const HfSource& src, float* params);

}  // namespace atl
