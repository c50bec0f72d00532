// The mapping tables between atoll's parameter names and Hugging Face's, one per architecture,
// serving both directions: the export (ckpt/export_hf.cc) writes by them and the import
// (ckpt/import_hf.h) reads by them, so a tensor named one way is read back the same way.
//
// Mixtral has two layouts of its experts: one matrix per expert
// ("block_sparse_moe.experts.{e}.w1.weight", what atoll writes and transformers before v5 loads)
// and transformers v5's fused one ("mlp.experts.gate_up_proj" [E, 2H, C] = w1 then w3 along dim 1,
// "mlp.experts.down_proj" [E, C, H], the router "mlp.gate.weight"), which v5 writes into newer
// checkpoints. Llama and Mistral (dense) name their one MLP "mlp.{gate,up,down}_proj.weight".
// Qwen3-MoE and OLMoE name each expert's matrices as Llama's MLP
// ("mlp.experts.{e}.{gate,up,down}_proj.weight", the router "mlp.gate.weight"; transformers v5
// fuses them as Mixtral's), and their q/k norms "self_attn.{q,k}_norm.weight".
// Qwen2-MoE names its experts and router as Qwen3-MoE, its q/k/v biases
// "self_attn.{q,k,v}_proj.bias" and its shared expert "mlp.shared_expert.{gate,up,down}_proj.weight"
// with the gate "mlp.shared_expert_gate.weight" [1, C]; Mixtral's and Llama's layouts have no
// names for these.
#pragma once

#include <string>
#include <vector>

#include "atoll/model/layout.h"

namespace atl {

// One tensor of the export: its Hugging Face name and shape, and where its elements start in
// the flat parameter buffer (a contiguous run of numel(shape) floats).
struct HfTensor {
  std::string name;            // e.g. "model.layers.0.block_sparse_moe.experts.1.w2.weight"
  std::vector<int64_t> shape;  // e.g. [C, H]
  size_t offset = 0;           // elements into the flat buffer
};

// Which names a Mixtral-shaped folder uses for its experts.
enum class HfExpertLayout {
  kPerExpert,  // block_sparse_moe.experts.{e}.w{1,2,3}.weight, block_sparse_moe.gate.weight
  kFused,      // mlp.experts.gate_up_proj, mlp.experts.down_proj, mlp.gate.weight (transformers v5)
  kDense,      // mlp.{gate,up,down}_proj.weight and no router (Llama, Mistral: one expert)
  kPerExpertMlp,  // mlp.experts.{e}.{gate,up,down}_proj.weight, mlp.gate.weight (Qwen3-MoE, OLMoE)
};
const char* expert_layout_name(HfExpertLayout l);

// One piece of an HF tensor: `rows` rows of `width` floats starting at row `row` of the HF
// tensor `name` (whole shape `shape`) are the floats of our buffer from `offset` on.
struct HfPiece {
  std::string name;
  std::vector<int64_t> shape;  // of the whole HF tensor
  int64_t row = 0, rows = 0;   // along the flattened leading dims: [row, row + rows)
  size_t offset = 0;           // into our flat buffer
};

// The HF tensors of a layout in `lay`, in layout order, as pieces of them: every element of the
// flat buffer is in exactly one piece. A fused or dense layout's tensor may gather several of our
// pieces (gate_up_proj: w1's then w3's rows of each expert). Throws Error naming a parameter the
// layout has no name for (a part Mixtral does not have), or for kDense a model with E != 1.
// The dense layout has no router: its pieces leave moe.router out (its caller zeroes it: with
// one expert, the router's weight is 1 whatever its logits).
std::vector<HfPiece> hf_mixtral_pieces(const ParamLayout& layout, HfExpertLayout lay);

// The tensors of a one-matrix-per-expert layout (kPerExpert: Mixtral's, which the export writes;
// kPerExpertMlp: Qwen3-MoE's and OLMoE's): hf_mixtral_pieces(lay), each piece a whole tensor.
std::vector<HfTensor> hf_mixtral_tensors(const ParamLayout& layout, HfExpertLayout lay = HfExpertLayout::kPerExpert);

}  // namespace atl
