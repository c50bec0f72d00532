// A checkpoint's manifest.json (ckpt/checkpoint.h) over any bytes, beside the rank file that
// atoll wrote for a tiny model: the manifest's fields, its index of files and tensors (names,
// offsets, shapes, checksums), the file names it gives (which must stay inside the checkpoint),
// the saved config and [model]; and checkpoints/latest, which names the newest checkpoint.
#include <filesystem>
#include <fstream>

#include "atoll/ckpt/checkpoint.h"
#include "fuzz/fuzz_target.h"
#include "fuzz/tiny_model.h"

namespace {

struct Fixture {
  atl::Config cfg;
  atl::ParamLayout layout;
  std::vector<float> param;
  std::string run, dir;
  Fixture() {
    cfg.model = atl::fuzz::tiny_model();
    layout = atl::ParamLayout::build(cfg.model);
    param.assign(layout.total(), 0.5f);
    run = atl::fuzz::scratch_dir() + "/run";
    dir = atl::save_checkpoint({.run_dir = run, .step = 1}, cfg, layout, {{"param", param.data()}}, {{"step", 1}});
    // A file outside the checkpoint that a manifest may try to name.
    std::ofstream(run + "/outside.safetensors") << "not yours";
  }
};

}  // namespace

ATOLL_FUZZ_TARGET(manifest) {
  static Fixture f;
  const std::string text(atl::fuzz::as_text(data, size));
  std::ofstream(f.dir + "/manifest.json", std::ios::trunc) << text;
  atl::fuzz::fuzz_reject([&] { atl::read_checkpoint_config(f.dir); });
  atl::fuzz::fuzz_reject([&] { atl::verify_checkpoint(f.dir, f.cfg.model); });
  atl::fuzz::fuzz_reject([&] {
    std::vector<float> into(f.layout.total());
    atl::load_checkpoint(f.dir, f.cfg.model, f.layout, {{"param", into.data()}});
  });
  // The same bytes as checkpoints/latest.
  std::ofstream(f.run + "/checkpoints/latest", std::ios::trunc) << text;
  atl::fuzz::fuzz_reject([&] { atl::latest_checkpoint(f.run); });
  return 0;
}
