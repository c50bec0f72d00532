// Prefill's attention (model/decoder.h Decoder::prefill): a block of n tokens at positions
// [pos, pos + n) whose keys and values have joined the decode cache, each query against every
// cached key up to its own position: the rows of causal attention over [0, pos + n) that the
// block's queries own, without the T×T matrix. One process holds every position (row t); under
// tree attention rank r holds position t at row t / P when t mod P = r (CacheShard), attends to
// its rows and the ranks merge their partial results by the three all-reduces of
// attend_cached_tree (model/attention_core.h), one per query row and head.
#pragma once

#include "atoll/model/attention_core.h"

namespace atl {

// The rows of k[n, KVD], v[n, KVD] (positions [pos, pos + n)) that `shard` holds, copied into
// its cache rows of k_cache, v_cache [rows, KVD].
template <typename T>
void cache_block(T* k_cache, T* v_cache, const T* k, const T* v, int n, int pos, int KVD, const CacheShard& shard);

// out[n, NH, HD] (=) for the queries q[n, NH, HD] at positions [pos, pos + n) against the cached
// keys and values k_cache, v_cache [rows, NKV·HD] (the block's own included: cache_block first);
// scale 1/sqrt(HD). Queries go in tiles of 64 rows of one head against key chunks, each a BLAS
// product, merged by the online softmax (flash attention's running max and sum per row), as
// model/ring_attention.cc's blocks. With a group (of shard.P ranks, fp32 only) every rank calls
// it together and gets the same out.
template <typename T>
void attend_prefix(T* out, const T* q, const T* k_cache, const T* v_cache, int n, int pos, int NH, int NKV, int HD,
                   const CacheShard& shard, Collective* group);

}  // namespace atl
