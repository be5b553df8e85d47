# Stand-ins for OpenWrt's UCI functions (/lib/functions.sh), so the procd init script's config
# generator runs on this machine: usage `sh uci-stub.sh <init script> <output toml>`.
config_load() { :; }
config_get() {
  case $3 in
    interface) eval "$1=lo" ;;
    api_password) eval "$1=\$STUB_PASSWORD" ;;
    shutdown_grace_secs) eval "$1=5" ;;
    *) eval "$1=\$4" ;;
  esac
}
config_list_foreach() { "$3" 0.0.0.0:5140; "$3" 127.0.0.1:5141; }
STUB_PASSWORD='p"w\x'
eval "$(tail -n +2 "$1")"
CONF=$2
generate_config
