// Bad updates from a peer (see update_guard.h).
#include "atoll/dist/update_guard.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <map>
#include <cstdlib>
#include <sstream>

#include "atoll/core/check.h"

namespace atl {
namespace {

constexpr size_t kSketch = 128;

struct Report {
  bool finite = true;
  double norm = 0;
  UpdateTag tag;
  RoundWork work;
  std::vector<double> sketch;  // kSketch buckets
  std::vector<double> counts;  // expert counts per slot (ExpertWork), if any
};

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A CountSketch of x (Charikar et al. 2002): element i goes to bucket h(i) with sign s(i), both
// from a hash of i and the outer step, the same on every member. The sketches' inner products
// estimate the vectors' (error ~ |a||b|/sqrt(kSketch)), so their cosines compare directions.
std::vector<double> count_sketch(const float* x, size_t n, int64_t seed) {
  std::vector<double> s(kSketch, 0.0);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t h = splitmix64(uint64_t(i) ^ (uint64_t(seed) << 40));
    s[h % kSketch] += (h >> 63) ? -double(x[i]) : double(x[i]);
  }
  return s;
}

double cosine(const std::vector<double>& a, const std::vector<double>& b) {
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < a.size(); ++i) ab += a[i] * b[i], aa += a[i] * a[i], bb += b[i] * b[i];
  return aa > 0 && bb > 0 ? ab / std::sqrt(aa * bb) : 1.0;
}

// "finite norm outer_step theta_hash step tokens sketch... [E counts...]" (hexfloats: exact)
std::string encode(const Report& r) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "%d %a %" PRId64 " %s %" PRId64 " %" PRId64, r.finite ? 1 : 0, r.norm,
                r.tag.outer_step, r.tag.theta_hash.empty() ? "-" : r.tag.theta_hash.c_str(), r.work.step,
                r.work.tokens);
  std::string out = buf;
  for (double v : r.sketch) std::snprintf(buf, sizeof buf, " %a", v), out += buf;
  if (!r.counts.empty()) out += " E";
  for (double v : r.counts) std::snprintf(buf, sizeof buf, " %a", v), out += buf;
  return out;
}

Report decode(const std::string& s) {
  Report r;
  int finite = 0;
  std::istringstream in(s);
  std::string norm, hash;
  in >> finite >> norm >> r.tag.outer_step >> hash >> r.work.step >> r.work.tokens;
  ATOLL_CHECK(!in.fail()) << "update report '" << s.substr(0, 100) << "'";
  r.finite = finite != 0;
  r.norm = std::strtod(norm.c_str(), nullptr);
  r.tag.theta_hash = hash == "-" ? "" : hash;
  std::string v;
  while (r.sketch.size() < kSketch && in >> v) r.sketch.push_back(std::strtod(v.c_str(), nullptr));
  ATOLL_CHECK_EQ(r.sketch.size(), size_t(kSketch));
  if (in >> v) {
    ATOLL_CHECK_EQ(v, "E") << "update report '" << s.substr(0, 100) << "'";
    while (in >> v) r.counts.push_back(std::strtod(v.c_str(), nullptr));
  }
  return r;
}

std::string tag_text(const UpdateTag& t) { return "outer step " + std::to_string(t.outer_step) + " (θ " + t.theta_hash + ")"; }

// x[lo, hi) *= s in doubles, as the whole-Δ scaling below does (1: untouched).
void scale_range(float* x, size_t lo, size_t hi, double s) {
  if (s != 1.0)
    for (size_t i = lo; i < hi; ++i) x[i] = float(double(x[i]) * s);
}

}  // namespace

GuardResult guard_update(ProcessGroup& group, float* x, size_t n, const UpdateTag& tag, const GuardOptions& opts,
                         const RoundWork& work, const ExpertWork* experts) {
  Report mine{.finite = true, .norm = 0, .tag = tag, .work = work, .sketch = {},
              .counts = experts ? experts->counts : std::vector<double>{}};
  double ss = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i])) mine.finite = false;
    else ss += double(x[i]) * double(x[i]);
  }
  mine.norm = mine.finite ? std::sqrt(ss) : 0.0;
  mine.sketch = mine.finite ? count_sketch(x, n, tag.outer_step) : std::vector<double>(kSketch, 0.0);
  const std::vector<std::string> blobs = group.allgather(encode(mine));
  const int P = int(blobs.size());
  std::vector<Report> all;
  for (const std::string& b : blobs) all.push_back(decode(b));

  // The round's tag: the most common; a tie goes to the one the lowest member holds.
  std::map<std::pair<int64_t, std::string>, int> votes;
  for (const Report& r : all) ++votes[{r.tag.outer_step, r.tag.theta_hash}];
  std::pair<int64_t, std::string> round{all[0].tag.outer_step, all[0].tag.theta_hash};
  for (const Report& r : all) {
    const std::pair<int64_t, std::string> t{r.tag.outer_step, r.tag.theta_hash};
    if (votes[t] > votes[round]) round = t;
  }
  GuardResult res;
  std::vector<bool> kept(size_t(P), false);
  std::vector<double> norms;
  for (int m = 0; m < P; ++m) {
    const Report& r = all[size_t(m)];
    std::string why;
    if (!r.finite) why = "not finite";
    else if (r.tag.outer_step != round.first || r.tag.theta_hash != round.second)
      why = "stale: computed from " + tag_text(r.tag) + " where the round is " + tag_text({round.first, round.second});
    if (!why.empty()) {
      res.incidents.push_back({.kind = "dropped_update", .member = m, .why = why, .norm = r.norm, .median = 0, .scale = 0});
      continue;
    }
    kept[size_t(m)] = true;
  }
  // Direction: against the coordinate-wise (lower) median of the kept sketches, which a single
  // opposed member cannot drag; with fewer than 3 kept there is no majority to side with.
  std::vector<int> kept_members;
  for (int m = 0; m < P; ++m)
    if (kept[size_t(m)]) kept_members.push_back(m);
  if (kept_members.size() >= 3 && opts.min_cosine > -1.0) {
    std::vector<double> median(kSketch);
    for (size_t b = 0; b < kSketch; ++b) {
      std::vector<double> v;
      for (int m : kept_members) v.push_back(all[size_t(m)].sketch[b]);
      std::sort(v.begin(), v.end());
      median[b] = v[(v.size() - 1) / 2];
    }
    for (int m : kept_members) {
      const double c = cosine(all[size_t(m)].sketch, median);
      if (c >= opts.min_cosine) continue;
      kept[size_t(m)] = false;
      char why[96];
      std::snprintf(why, sizeof why, "opposed: cosine %.3f with the round's median direction", c);
      res.incidents.push_back(
          {.kind = "dropped_update", .member = m, .why = why, .norm = all[size_t(m)].norm, .median = 0, .scale = 0});
    }
  }
  for (int m = 0; m < P; ++m)
    if (kept[size_t(m)]) norms.push_back(all[size_t(m)].norm);
  res.contributors = int(norms.size());
  std::vector<double> scale(size_t(P), 1.0);
  if (!norms.empty() && opts.clip_factor > 0) {
    std::vector<double> sorted = norms;
    std::sort(sorted.begin(), sorted.end());
    const double median = sorted[(sorted.size() - 1) / 2];
    const double limit = opts.clip_factor * median;
    for (int m = 0; m < P; ++m) {
      const double norm = all[size_t(m)].norm;
      if (!kept[size_t(m)] || norm <= limit) continue;
      scale[size_t(m)] = limit / norm;
      res.incidents.push_back(
          {.kind = "clipped_update", .member = m, .why = "", .norm = norm, .median = median, .scale = scale[size_t(m)]});
    }
  }
  std::sort(res.incidents.begin(), res.incidents.end(),
            [](const UpdateIncident& a, const UpdateIncident& b) { return a.member < b.member; });
  const int me = group.rank();
  int64_t kept_tokens = 0;
  for (int m = 0; m < P; ++m) {
    const RoundWork& w = all[size_t(m)].work;
    res.furthest_step = std::max(res.furthest_step, w.step);
    res.tokens += w.tokens;
    if (kept[size_t(m)]) kept_tokens += w.tokens;
  }
  std::vector<std::vector<double>> counts;  // per member, with expert counts (step 6)
  if (experts) {
    for (const Report& r : all) counts.push_back(r.counts);
    res.unused_slots = unused_slots(counts, kept);
  }
  if (!kept[size_t(me)]) {
    res.weight = 0;
    std::fill(x, x + n, 0.0f);
    return res;
  }
  // Weighted by tokens: K·nᵢ/Σn, exactly 1 when the counts are equal (both products are exact
  // integers in a double), so the mean over the K below becomes Σ nᵢΔᵢ / Σ nᵢ.
  if (opts.weight_by_tokens && kept_tokens > 0)
    res.weight = double(res.contributors) * double(all[size_t(me)].work.tokens) / double(kept_tokens);
  // The ring divides by P: scaling the kept ones by P/K makes it the mean over the K.
  const double s = scale[size_t(me)] * double(P) / double(res.contributors) * res.weight;
  if (!experts) {
    scale_range(x, 0, n, s);
    return res;
  }
  // Experts: each slot's elements by its own factor (expert_merge.h), the dense ones between by s.
  const std::vector<double> factor = expert_factors(counts, kept, me, scale[size_t(me)]);
  size_t at = 0;
  for (const ExpertSpan& span : experts->spans) {
    ATOLL_CHECK(span.begin >= at && span.end <= n && span.slot >= 0 && size_t(span.slot) < factor.size())
        << "expert span [" << span.begin << ", " << span.end << ") slot " << span.slot;
    scale_range(x, at, span.begin, s);
    scale_range(x, span.begin, span.end, factor[size_t(span.slot)]);
    at = span.end;
  }
  scale_range(x, at, n, s);
  return res;
}

}  // namespace atl
