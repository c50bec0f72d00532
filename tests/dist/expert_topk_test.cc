// The sparse expert exchange (diloco.expert_topk, dist/expert_topk.h), with real processes over
// real groups: the choice takes the largest norms of each layer, ties to the lower slot; with the
// codec in the loop, what was sent plus the new residual is what the island meant to send
// (Δ + the old residual) to the last bit, in every codec and over two rounds; the mean divides by
// every island (zeros for an island that did not send an expert); an expert no island sent keeps
// θ and its outer momentum; the dense elements take the plain mean; every island ends with the
// same θ; an island the guard dropped sends nothing and keeps its residual; the experts' bytes are
// fewer than the dense ring's; and two ranks per island (each sending its shard of the experts
// the island chose together) give the unsharded run's θ bit for bit.
#include "atoll/dist/expert_topk.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <sstream>

#include "atoll/dist/diloco.h"
#include "dist_test_util.h"

namespace atl {
namespace {

using testing::run_processes;

class ExpertTopkTest : public testing::RedisSuite {};

std::string floats_text(const std::vector<float>& x) {
  std::ostringstream s;
  for (float v : x) s << std::hexfloat << v << " ";
  return s.str();
}

std::vector<float> parse(const std::string& text) {
  std::istringstream s(text);
  std::vector<float> out;
  for (std::string v; s >> v;) out.push_back(std::strtof(v.c_str(), nullptr));
  return out;
}

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> parts;
  for (size_t at = 0, end; (end = text.find('|', at)) != std::string::npos; at = end + 1)
    parts.push_back(text.substr(at, end - at));
  return parts;
}

TEST(ChooseExperts, TakesEachLayersLargestNormsWithTiesToTheLowerSlot) {
  // Two layers of 4: layer 0 has a tie between slots 1 and 3; slot 6 has a zero norm, slot 5 is
  // not eligible (an expert no island used, under expert_merge = "tokens").
  const std::vector<double> norms = {1.0, 5.0, 2.0, 5.0, 0.5, 9.0, 0.0, 0.25};
  std::vector<bool> eligible(8, true);
  eligible[5] = false;
  EXPECT_EQ(choose_experts(norms, eligible, 4, 1), (std::vector<int>{1, 4}));
  EXPECT_EQ(choose_experts(norms, eligible, 4, 2), (std::vector<int>{1, 3, 4, 7}));
  EXPECT_EQ(choose_experts(norms, eligible, 4, 4), (std::vector<int>{0, 1, 2, 3, 4, 7}));  // never a 0 norm
  EXPECT_EQ(choose_experts(norms, eligible, 4, 0), (std::vector<int>{}));
  EXPECT_EQ(experts_to_send(0.25, 4), 1);
  EXPECT_EQ(experts_to_send(0.3, 4), 2);  // rounded up
  EXPECT_EQ(experts_to_send(0.01, 16), 1);  // at least one
  EXPECT_EQ(experts_to_send(0.5, 16), 8);
  EXPECT_EQ(experts_to_send(0.0, 16), 16);  // off: every expert
  EXPECT_EQ(experts_to_send(1.0, 16), 16);
}

// x of 700 elements: dense [0, 3), slot 0 [3, 10), dense [10, 12), slot 1 [12, 312) (two codec
// blocks, the second short), slot 2 [312, 600), slot 3 [600, 697), dense [697, 700). Values of
// many sizes and both signs, so that quantization rounds some to zero and some up.
constexpr size_t kX = 700;
const std::vector<ExpertSpan> kSpans = {{3, 10, 0}, {12, 312, 1}, {312, 600, 2}, {600, 697, 3}};

std::vector<float> x_of(int member, int round) {
  std::vector<float> x(kX);
  for (size_t i = 0; i < kX; ++i)
    x[i] = float(std::sin(double(i) * 0.37 + member + 3 * round) * std::exp(-double(i % 53) / 6.0) * 1e-2);
  return x;
}

// Each member's slots per round, some shared and some not; member 1 is dropped in round 1 when asked.
std::vector<int> chosen_of(int member, int round) {
  if (member == 0) return round == 0 ? std::vector<int>{0, 2} : std::vector<int>{1};
  return round == 0 ? std::vector<int>{2, 3} : std::vector<int>{0, 1, 3};
}

// Two members, two rounds, with `codec`: per round "x after | residual (slot order) |".
std::vector<std::string> two_rounds(const StoreOptions& run, Codec codec, bool compress, int dropped_in_round_1) {
  return run_processes(2, [&](int rank) {
    Store store(run);
    ProcessGroup g(store, GroupOptions{.name = "outer-r0", .rank = rank, .size = 2});
    ExpertTopk topk(kSpans, kX, 4, {.experts_per_layer = 4, .codec = codec, .compress = compress});
    std::string text;
    for (int round = 0; round < 2; ++round) {
      std::vector<float> x = x_of(rank, round);
      const bool contributes = !(round == 1 && rank == dropped_in_round_1);
      const TopkResult res = topk.exchange(g, x.data(), chosen_of(rank, round), contributes);
      topk.commit();
      text += floats_text(x) + "|" + floats_text(topk.residual_by_slot()) + "|";
      if (round == 0) {
        EXPECT_EQ(res.unsent, std::vector<int>{1}) << "slot 1: nobody sent it in round 0";
        EXPECT_GT(res.bytes, 0u);
      }
    }
    return text;
  });
}

std::vector<float> slot_order(const std::vector<float>& x) {
  std::vector<float> out;
  for (const ExpertSpan& s : kSpans) out.insert(out.end(), x.begin() + long(s.begin), x.begin() + long(s.end));
  return out;
}

size_t slot_at(int slot) {
  size_t at = 0;
  for (const ExpertSpan& s : kSpans)
    if (s.slot < slot) at += s.end - s.begin;
  return at;
}

// What a member meant to send (v = x + r in slot order) and what the codec's bytes of it decode to
// (0 where not sent), recomputed here from the codec alone; and the residual that must remain.
struct Round {
  std::vector<float> v, sent, residual;
};

Round expected_round(Codec codec, const std::vector<float>& x, const std::vector<float>& r, const std::vector<int>& chosen,
                     bool contributes) {
  Round e{.v = slot_order(x), .sent = {}, .residual = {}};
  for (size_t k = 0; k < e.v.size() && !r.empty(); ++k) e.v[k] += r[k];
  e.sent.assign(e.v.size(), 0.0f);
  e.residual = contributes ? e.v : r;
  if (!contributes) return e;
  for (int s : chosen) {
    const size_t lo = slot_at(s), len = kSpans[size_t(s)].end - kSpans[size_t(s)].begin;
    std::vector<uint8_t> bytes(encoded_bytes(codec, len));
    encode_reference(codec, e.v.data() + lo, len, bytes.data());
    decode_reference(codec, bytes.data(), len, e.sent.data() + lo);
    for (size_t k = lo; k < lo + len; ++k) e.residual[k] = e.v[k] - e.sent[k];
  }
  return e;
}

void expect_rounds(Codec codec, const std::vector<std::string>& out, int dropped_in_round_1) {
  ASSERT_EQ(out.size(), 2u);
  std::vector<std::vector<std::string>> parts;
  for (const std::string& o : out) parts.push_back(split(o));
  ASSERT_EQ(parts[0].size(), 4u) << out[0];
  ASSERT_EQ(parts[1].size(), 4u) << out[1];
  std::vector<std::vector<float>> r(2);  // each member's residual going into the round
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    EXPECT_TRUE(slot_order(parse(parts[0][2 * size_t(round)])) == slot_order(parse(parts[1][2 * size_t(round)])))
        << "the experts' mean differs between members";
    std::vector<Round> e;
    for (int m = 0; m < 2; ++m) {
      const bool contributes = !(round == 1 && m == dropped_in_round_1);
      e.push_back(expected_round(codec, x_of(m, round), r[size_t(m)], chosen_of(m, round), contributes));
      const std::vector<float> got = parse(parts[size_t(m)][2 * size_t(round) + 1]);
      ASSERT_EQ(got.size(), e[size_t(m)].v.size()) << "member " << m;
      for (size_t k = 0; k < got.size(); ++k) {
        // The residual is v − sent, and residual + sent is v to the last bit.
        ASSERT_EQ(got[k], e[size_t(m)].residual[k]) << "member " << m << " element " << k;
        if (contributes) {
          ASSERT_EQ(got[k] + e[size_t(m)].sent[k], e[size_t(m)].v[k]) << "member " << m << " element " << k;
        }
      }
      r[size_t(m)] = got;
    }
    // The mean: each expert's sum of what the members sent over both members (0 from one that
    // did not send it); the dense elements untouched.
    const std::vector<float> mean = parse(parts[0][2 * size_t(round)]), x0 = x_of(0, round);
    ASSERT_EQ(mean.size(), kX);
    const std::vector<float> mean_slots = slot_order(mean);
    for (size_t k = 0; k < mean_slots.size(); ++k) {
      const double want = (double(e[0].sent[k]) + double(e[1].sent[k])) / 2;
      // fp32: one rounding of the sum and none of the halving (a power of two).
      ASSERT_NEAR(mean_slots[k], want, 0x1p-24 * (std::fabs(e[0].sent[k]) + std::fabs(e[1].sent[k]))) << "element " << k;
    }
    for (size_t i : {0, 1, 2, 10, 11, 697, 698, 699}) EXPECT_EQ(mean[i], x0[i]) << "dense element " << i;
  }
}

TEST_F(ExpertTopkTest, TheResidualPlusWhatWasSentIsWhatTheIslandMeantToSendInEveryCodec) {
  for (const Codec codec : {Codec::kFp32, Codec::kBf16, Codec::kInt8, Codec::kInt4}) {
    SCOPED_TRACE(codec_name(codec));
    const std::string name = std::string("topk-codec-") + codec_name(codec);
    expect_rounds(codec, two_rounds(store_options(name), codec, false, -1), -1);
  }
  // zstd over the payload changes no value.
  expect_rounds(Codec::kInt8, two_rounds(store_options("topk-zstd"), Codec::kInt8, true, -1), -1);
}

TEST_F(ExpertTopkTest, ADroppedMemberSendsNothingAndKeepsItsResidual) {
  expect_rounds(Codec::kInt8, two_rounds(store_options("topk-dropped"), Codec::kInt8, false, 1), 1);
}

// DilocoSync with θ of 1241 elements: dense [0, 5), layer 0's experts (slots 0..3, 7 elements
// each) [5, 33), dense [33, 37), layer 1's experts (slots 4..7, 300 each) [37, 1237), dense
// [1237, 1241). E = 4, diloco.expert_topk = 0.25: one expert per layer per island.
constexpr size_t kN = 1241;
constexpr int kE = 4;

std::vector<ExpertSpan> theta_experts() {
  std::vector<ExpertSpan> spans;
  for (int e = 0; e < kE; ++e) spans.push_back({5 + size_t(e) * 7, 12 + size_t(e) * 7, e});
  for (int e = 0; e < kE; ++e) spans.push_back({37 + size_t(e) * 300, 337 + size_t(e) * 300, kE + e});
  return spans;
}

int slot_of(size_t i) {
  for (const ExpertSpan& s : theta_experts())
    if (i >= s.begin && i < s.end) return s.slot;
  return -1;
}

std::vector<float> theta0() {
  std::vector<float> x(kN);
  for (size_t i = 0; i < kN; ++i) x[i] = float(0.5 * std::cos(double(i)));
  return x;
}

// Island m's drift in a round: each expert's size chosen so that in layer 0 both islands pick
// slot 1, and in layer 1 island 0 picks slot 4 and island 1 slot 6 (the others are unsent).
double drift_scale(int m, int slot) {
  static const double scale[2][8] = {{1, 9, 2, 3, 8, 1, 2, 3}, {2, 9, 1, 3, 1, 2, 8, 3}};
  return slot < 0 ? 1.0 : scale[m][slot];
}

std::vector<float> local_of(int m, const std::vector<float>& theta) {
  std::vector<float> x = theta;
  for (size_t i = 0; i < kN; ++i)
    x[i] -= float(1e-3 * drift_scale(m, slot_of(i)) * (1.5 + std::sin(double(i) * 0.7 + m)));
  return x;
}

constexpr double kLr = 1.0, kMu = 0.5;

DilocoOptions sparse_options(double topk, Codec codec = Codec::kFp32) {
  return {.outer_lr = kLr, .outer_momentum = kMu, .ring = {.codec = codec}, .guard = {.clip_factor = 0},
          .experts = theta_experts(), .expert_slots = 0, .expert_topk = topk, .experts_per_layer = kE};
}

// Per island: "θ | m | residual | hash | bytes |" after one round.
std::vector<std::string> one_round(const StoreOptions& run, double topk) {
  return run_processes(2, [&](int rank) {
    Store store(run);
    ProcessGroup g(store, GroupOptions{.name = "outer-r0", .rank = rank, .size = 2});
    const std::vector<float> t0 = theta0();
    DilocoSync sync(g, t0.data(), kN, sparse_options(topk));
    std::vector<float> local = local_of(rank, t0);
    const SyncResult r = sync.sync(local.data());
    EXPECT_EQ(hash_floats(local.data(), kN), r.theta_hash);  // θ_local <- θ, unsent experts too
    std::vector<float> residual(kN, -1.0f);
    if (sync.sends_sparse()) sync.expert_residual(residual.data());
    return floats_text(sync.theta()) + "|" + floats_text(sync.momentum()) + "|" + floats_text(residual) + "|" +
           r.theta_hash + "|" + std::to_string(r.bytes_sent) + "|";
  });
}

TEST_F(ExpertTopkTest, UnsentExpertsKeepThetaAndTheMeanCountsEveryIsland) {
  const auto out = one_round(store_options("topk-sync"), 0.25);
  const auto dense = one_round(store_options("topk-sync-dense"), 0.0);
  std::vector<std::vector<std::string>> parts, dense_parts;
  for (const auto& o : out) parts.push_back(split(o));
  for (const auto& o : dense) dense_parts.push_back(split(o));
  ASSERT_EQ(parts[0].size(), 5u) << out[0];
  ASSERT_EQ(dense_parts[0].size(), 5u) << dense[0];
  for (size_t p : {0, 1, 3}) EXPECT_EQ(parts[0][p], parts[1][p]) << "θ, m and the hash agree across islands";
  const std::vector<float> theta = parse(parts[0][0]), mom = parse(parts[0][1]), t0 = theta0();
  const std::vector<std::vector<float>> residual = {parse(parts[0][2]), parse(parts[1][2])};
  const std::vector<std::vector<float>> delta = {local_of(0, t0), local_of(1, t0)};
  ASSERT_EQ(theta.size(), kN);
  for (size_t i = 0; i < kN; ++i) {
    const int slot = slot_of(i);
    const double d0 = double(t0[i]) - double(delta[0][i]), d1 = double(t0[i]) - double(delta[1][i]);
    // Who sent what: slot 1 both, slot 4 island 0, slot 6 island 1, the dense elements both.
    const bool sent0 = slot < 0 || slot == 1 || slot == 4, sent1 = slot < 0 || slot == 1 || slot == 6;
    if (!sent0 && !sent1) {  // an expert no island sent: θ and m as they were
      EXPECT_EQ(theta[i], t0[i]) << "element " << i << " (slot " << slot << ")";
      EXPECT_EQ(mom[i], 0.0f) << "element " << i;
    } else {
      const double mean = ((sent0 ? d0 : 0.0) + (sent1 ? d1 : 0.0)) / 2;  // over both islands, zeros included
      // fp32: the Δs, their sum and the outer step round a few times at ~1e-3 (Δ) and ~0.5 (θ).
      EXPECT_NEAR(mom[i], mean, 1e-9) << "element " << i << " (slot " << slot << ")";
      EXPECT_NEAR(theta[i], double(t0[i]) - kLr * (mean + kMu * mean), 2e-7) << "element " << i;
    }
    if (slot >= 0) {  // what an island did not send waits in its residual (fp32: exactly its Δ)
      EXPECT_EQ(residual[0][i], sent0 ? 0.0f : t0[i] - delta[0][i]) << "island 0, element " << i;
      EXPECT_EQ(residual[1][i], sent1 ? 0.0f : t0[i] - delta[1][i]) << "island 1, element " << i;
    } else {
      EXPECT_EQ(residual[0][i], 0.0f) << "no expert residual at dense element " << i;
    }
  }
  // Bytes: the dense ring moves every element once (2 islands); the sparse exchange the dense
  // elements plus 2 of 8 experts (about a quarter of the experts' 1228 elements).
  const double sparse_bytes = std::stod(parts[0][4]), dense_bytes = std::stod(dense_parts[0][4]);
  EXPECT_LT(sparse_bytes, 0.4 * dense_bytes) << sparse_bytes << " against " << dense_bytes;
}

// Two islands of two ranks: each rank exchanges its half of Δ over its own outer group, the
// island's ranks choose the same experts from their summed norms, and θ after two rounds (the
// second one with residuals) is the unsharded run's, bit for bit (fp32: every sum is of two).
TEST_F(ExpertTopkTest, ShardedIslandsGiveTheUnshardedTheta) {
  auto rounds = [&](DilocoSync& sync, int island) {
    std::string text;
    for (int round = 0; round < 2; ++round) {
      std::vector<float> local = local_of(island, sync.theta());
      text += sync.sync(local.data()).theta_hash + " ";
    }
    return text + floats_text(sync.theta()) + floats_text(sync.momentum());
  };
  const auto whole = run_processes(2, [&](int rank) {
    Store store(store_options("topk-whole"));
    ProcessGroup g(store, GroupOptions{.name = "outer-r0", .rank = rank, .size = 2});
    const std::vector<float> t0 = theta0();
    DilocoSync sync(g, t0.data(), kN, sparse_options(0.25));
    return rounds(sync, rank);
  });
  const auto sharded = run_processes(4, [&](int w) {
    const int island = w / 2, rank = w % 2;
    Store store(store_options("topk-sharded"));
    ProcessGroup in(store, GroupOptions{.name = "island" + std::to_string(island), .rank = rank, .size = 2});
    ProcessGroup outer(store, GroupOptions{.name = "outer-r" + std::to_string(rank), .rank = island, .size = 2});
    const std::vector<float> t0 = theta0();
    DilocoSync sync(outer, t0.data(), kN, sparse_options(0.25), {}, &in);
    return rounds(sync, island);
  });
  EXPECT_EQ(whole[0], whole[1]);
  for (const std::string& s : sharded) EXPECT_EQ(s, whole[0]);
}

}  // namespace
}  // namespace atl
