// Bias balancing without an auxiliary loss (ZAYA1-8B): after each optimizer step, each zaya
// router's balancing biases take one AdamW step whose gradient is its experts' load error.
//
// The loads. A zaya router's backward adds, per class e of its E+1 (experts, then the skip
// class), loss_scale * (slots that chose e) / (slots) into the gradient slot of its balancing-bias
// row (model/router_zaya.h). So, like a gradient, the slot sums the step's micro-batches, rides
// on the island's gradient mean (every worker's batch: the whole global batch of the island)
// and, in the data-parallel warm start, on the mean across islands. p_e is then expert e's share
// of the slots routed to an expert: p_e = g_e / Σ_{e'<E} g_e' (any common factor, a loss scale or
// the clip's, cancels). The gradient norm leaves these slots out (balanced_spans).
//
// The skip class. Its slot counts the tokens that bypass the experts (logged as load_skip) but
// takes no part in p: balancing spreads the routed tokens evenly over the E experts, and the
// skip class's bias keeps its initial value (model.router_skip_bias), so whether a token skips
// is the router's own choice through its probabilities, not the balancer's.
//
// The step. error_e = p_e − 1/E is fed as the gradient of AdamW (optim.beta1, beta2, eps; lr
// optim.bias_balance_lr; no weight decay) on the E expert biases: an overloaded expert's bias
// falls. Its moments are the adam_m and adam_v slots of the bias row (the optimizer never steps
// a buffer, so they are free), and it counts steps with the optimizer (t), so checkpoints, resume,
// state transfer and hashing carry the biases and their moments with everything else.
//
// DiLoCo. The biases are parameters of the flat buffer, so each island balances on its own
// loads between outer steps and the outer step agrees them like every parameter: θ's biases
// take the outer Nesterov step on the islands' mean pseudo-gradient, and every island restarts
// from the same θ (bit-identical, checked by hash); the moments stay per island, as AdamW's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "atoll/model/layout.h"
#include "atoll/optim/adamw.h"

namespace atl {

// The rows of the layout that bias balancing steps (ParamEntry::balanced), in layout order.
std::vector<const ParamEntry*> balanced_rows(const ParamLayout& layout);

// Their spans {offset, numel} in the flat buffers: what the gradient norm leaves out.
std::vector<std::pair<size_t, size_t>> balanced_spans(const ParamLayout& layout);

// One router's load this step, from its row's gradient slot (E+1 classes, the skip class last).
struct RouterLoad {
  int layer = -1;
  double entropy = 0;     // H(p) / ln E over the E experts (1 = even; 1 when E = 1)
  double max_load = 0;    // max_e p_e
  double min_load = 0;    // min_e p_e
  double skip_share = 0;  // share of all slots that chose the skip class
};
RouterLoad router_load(const float* grads, const ParamEntry& row);
// The same figures from per-expert slot counts[E] (the softmax router's choices; no skip class).
RouterLoad router_load_from_counts(int layer, const double* counts, size_t experts);

// One balancing step after the optimizer's step t (t >= 1) on every balanced row: params, m and
// v are updated in place from grads (see above). `opt` gives lr, betas and eps; its weight decay
// is not used (none). A row whose experts took no slot this step is left as it is.
void balance_biases(float* params, float* m, float* v, const float* grads, const ParamLayout& layout, int64_t t,
                    const AdamWOptions& opt);
// The same on these rows (offsets into the buffers given): a ZeRO-1 shard's (optim/zero_shard.h).
void balance_biases(float* params, float* m, float* v, const float* grads, const std::vector<ParamEntry>& rows,
                    int64_t t, const AdamWOptions& opt);

}  // namespace atl
