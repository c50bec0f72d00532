# Sourced by the setup and check scripts: install_missing PKG... installs those of the Debian
# packages that are not installed yet (apt-get, through sudo when not root); nothing when all are.
install_missing() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  ((${#missing[@]})) || return 0
  echo "${0##*/}: installing ${missing[*]}"
  local sudo_cmd=()
  [ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
  # Another install may hold dpkg's lock (CI fetches some packages in the background): wait for it.
  local wait=(-o DPkg::Lock::Timeout=900)
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get "${wait[@]}" update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get "${wait[@]}" install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}
