# Sourced by the build scripts: compile through ccache when it is installed, its cache outside
# the clone (~/.cache/ccache, or $CCACHE_DIR), with paths taken relative to this checkout so
# that another clone or worktree of the same sources hits the same entries. Sets
# ATOLL_CCACHE_ARGS, the cmake arguments (empty without ccache).
ATOLL_CCACHE_ARGS=()
if command -v ccache >/dev/null; then
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
  export CCACHE_NOHASHDIR=1
  export CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-8G}
  ATOLL_CCACHE_ARGS=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
