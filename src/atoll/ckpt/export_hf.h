// Export to the Hugging Face Mixtral layout (DESIGN.md, "Export"), or to ZAYA1's for a model
// with ZAYA1's parts, or Qwen3-MoE's / OLMoE's for a model with their q/k norm
// (ckpt/export_zaya.h; hf_architecture decides, and refuses other mixes): OUT/config.json with
// "architectures": ["MixtralForCausalLM"] and OUT/model.safetensors (fp32) holding the
// transformers MixtralForCausalLM tensor names. Our matrices are already row-major [out, in]
// as torch.nn.Linear stores them, and our RoPE is rotate-half as in transformers, so tensors
// are copied as they are; only the stacked expert tensors [E, out, in] are split into one
// matrix per expert.
#pragma once

#include <string>
#include <vector>

#include "atoll/ckpt/hf_tables.h"
#include "atoll/config/config.h"
#include "atoll/model/layout.h"

namespace atl {

// transformers' MixtralConfig for `m`, as config.json holds it.
std::string hf_mixtral_config_json(const ModelConfig& m);

// Writes config.json, model.safetensors and, when `tokenizer_path` is given, a copy of it as
// tokenizer.model into `out_dir`, with atoll-export.json listing those files: the files atoll
// wrote. The whole folder is built under a temporary name and renamed into place, so a crash
// or an error leaves the old folder as it was. `out_dir` may be missing, empty, or an earlier
// export (its atoll-export.json; or, from before that record, config.json naming
// MixtralForCausalLM beside model.safetensors): atoll's files in it are replaced and every
// other file (a README.md the user added) is kept. Only the names an export writes, as files,
// are ever replaced: anything else the record lists (a folder, another name) is kept, with a
// warning. Refused with
// IoError, naming the files: any other non-empty folder, and an earlier export holding a file
// atoll did not write under a name this export writes. `params` is laid out by `layout`.
//
// With `special` (the tokenizer's special pieces, read by the caller from tokenizer.model) it
// also writes tokenizer_config.json, saying how atoll tokenizes: no BOS or EOS added to a text,
// no leading space (SentencePiece's add_dummy_prefix is off), so that tools that read it
// (transformers, llama.cpp's converter) give atoll's ids exactly; and config.json and
// generation_config.json get the special ids (bos_token_id, eos_token_id, pad_token_id). A
// generation_config.json already in `out_dir` (the user's sampling settings) keeps its other keys:
// only the ids are set in it; one that is not a JSON object is refused with IoError.
struct HfSpecialTokens {
  int bos = -1, eos = -1, unk = -1, pad = -1;  // ids, -1 = the tokenizer has none
  std::string bos_piece{}, eos_piece{}, unk_piece{}, pad_piece{};
  bool given() const { return bos >= 0 || eos >= 0 || unk >= 0; }
};
void export_hf(const std::string& out_dir, const ModelConfig& m, const ParamLayout& layout, const float* params,
               const std::string& tokenizer_path = "", const HfSpecialTokens& special = {});

}  // namespace atl
