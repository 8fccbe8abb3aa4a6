#!/usr/bin/env bash
# Prepares a host for silt-metadata.service or silt-agent.service: installs the silt binary,
# creates the silt user, mounts the data disk at /var/lib/silt and, for agents, writes the
# agent's id. The Terraform modules run this same script on first boot (cloud-init); by hand,
# run it as root (docs/deploy.md). Running it again is safe: that is also how a node is upgraded.
#
#   install-silt.sh --url URL --sha256 HEX [--role metadata|agent] [--disk DEVICE]
#
#   --url     where the silt binary is: https://..., s3://bucket/key (needs the aws CLI and
#             s3:GetObject on it) or file:///path; either the bare binary or a .tar.gz holding
#             a file named silt.
#   --sha256  the SHA-256 of that file; nothing is installed if it differs.
#   --role    agent also writes /etc/silt/agent-id.env once per machine: SILT_AGENT_ID is the
#             EC2 instance id, or /etc/machine-id elsewhere. Default: metadata.
#   --disk    format DEVICE with XFS if it has no filesystem yet (an existing one is never
#             touched) and mount it at /var/lib/silt, by UUID, through /etc/fstab. DEVICE is a
#             path, ebs:vol-0123... (an EBS volume by id; waits until it is attached),
#             ebs-data (the first EBS volume that is not the root disk) or instance-store (the
#             first NVMe instance store disk). Without --disk, /var/lib/silt stays on the root
#             filesystem (fine for trying things, not for production).
set -euo pipefail

url='' sha256='' role=metadata disk=''
while (($#)); do
  case $1 in
    --url) url=$2; shift 2 ;;
    --sha256) sha256=$2; shift 2 ;;
    --role) role=$2; shift 2 ;;
    --disk) disk=$2; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "install-silt: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ -n $url && -n $sha256 ]] || { echo "install-silt: --url and --sha256 are required" >&2; exit 2; }
[[ $sha256 =~ ^[0-9a-f]{64}$ ]] || { echo "install-silt: --sha256 must be 64 lowercase hex digits" >&2; exit 2; }
[[ $role == metadata || $role == agent ]] || { echo "install-silt: --role is metadata or agent" >&2; exit 2; }
[[ $(id -u) -eq 0 ]] || { echo "install-silt: run as root" >&2; exit 1; }

log() { echo "install-silt: $*" >&2; }
data=/var/lib/silt

# --- user and directories
if ! id silt >/dev/null 2>&1; then
  useradd --system --home-dir "$data" --no-create-home --shell /usr/sbin/nologin silt
  log "created user silt"
fi
install -d -m 0755 /etc/silt

# --- the data disk
# wait_for SECONDS COMMAND...: runs COMMAND until it prints a path.
wait_for() {
  local seconds=$1 found
  shift
  for ((i = 0; i < seconds; i++)); do
    if found=$("$@") && [[ -n $found ]]; then echo "$found"; return 0; fi
    sleep 1
  done
  return 1
}
whole_disks() { # by-id links of whole disks (no partitions) matching a glob, resolved
  local link
  for link in $1; do
    [[ -e $link && $link != *-part* ]] && readlink -f "$link"
  done | sort -u
}
root_disk() { # the disk holding /, e.g. nvme0n1
  local src parent
  src=$(findmnt -no SOURCE /)
  parent=$(lsblk -no PKNAME "$src" 2>/dev/null | head -1)
  echo "${parent:-$(basename "$src")}"
}
find_ebs_volume() { # ebs:vol-0abc -> /dev/nvme1n1 once attached
  local link=/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_${1//-/}
  [[ -e $link ]] && readlink -f "$link"
}
find_ebs_data() {
  local dev root
  root=$(root_disk)
  for dev in $(whole_disks '/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_vol*'); do
    [[ ${dev#/dev/} != "$root" ]] && { echo "$dev"; return; }
  done
}
find_instance_store() { whole_disks '/dev/disk/by-id/nvme-Amazon_EC2_NVMe_Instance_Storage_*' | head -1; }

if [[ -n $disk ]]; then
  case $disk in
    ebs:vol-*) dev=$(wait_for 900 find_ebs_volume "${disk#ebs:}") || { log "EBS volume ${disk#ebs:} was not attached within 15 minutes"; exit 1; } ;;
    ebs-data) dev=$(wait_for 300 find_ebs_data) || { log "no EBS data volume besides the root disk"; exit 1; } ;;
    instance-store) dev=$(wait_for 120 find_instance_store) || { log "no NVMe instance store disk on this instance type"; exit 1; } ;;
    /dev/*) dev=$disk; [[ -b $dev ]] || { log "$dev is not a block device"; exit 1; } ;;
    *) log "--disk: '$disk' is not a device path, ebs:vol-..., ebs-data or instance-store"; exit 2 ;;
  esac
  if ! blkid -p "$dev" >/dev/null 2>&1; then
    log "formatting $dev (XFS): it has no filesystem"
    mkfs.xfs -q -L silt-data "$dev"
  else
    log "$dev already has a filesystem; keeping it and its data"
  fi
  uuid=$(blkid -s UUID -o value "$dev")
  install -d -m 0750 "$data"
  if ! grep -q "^UUID=$uuid " /etc/fstab; then
    # Drop an older entry for the mount point (an instance store disk gets a new UUID).
    sed -i "\\# $data #d" /etc/fstab
    echo "UUID=$uuid $data xfs defaults,noatime,nofail,x-systemd.device-timeout=5min 0 2" >>/etc/fstab
  fi
  systemctl daemon-reload
  mountpoint -q "$data" || mount "$data"
  log "$dev mounted at $data"
fi
install -d -m 0750 "$data"
chown silt:silt "$data"

# --- the agent's id: once per machine, never reused
if [[ $role == agent && ! -s /etc/silt/agent-id.env ]]; then
  # On EC2 (Nitro) the instance id is the board asset tag; else ask the instance metadata
  # service, but only on EC2; elsewhere use the machine id.
  id=$(cat /sys/devices/virtual/dmi/id/board_asset_tag 2>/dev/null || true)
  [[ $id =~ ^i-[0-9a-f]+$ ]] || id=''
  if [[ -z $id ]] && grep -qs 'Amazon EC2' /sys/devices/virtual/dmi/id/sys_vendor; then
    token=$(curl -sf -m 2 -X PUT http://169.254.169.254/latest/api/token \
      -H 'X-aws-ec2-metadata-token-ttl-seconds: 60' || true)
    if [[ -n $token ]]; then
      id=$(curl -sf -m 2 -H "X-aws-ec2-metadata-token: $token" \
        http://169.254.169.254/latest/meta-data/instance-id || true)
    fi
  fi
  [[ -n $id ]] || id=$(cat /etc/machine-id)
  echo "SILT_AGENT_ID=$id" >/etc/silt/agent-id.env
  log "agent id $id"
fi

# --- the binary
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
case $url in
  s3://*) aws s3 cp --only-show-errors "$url" "$tmp/download" ;;
  https://*|file://*) curl -fsSL --retry 5 --retry-connrefused -o "$tmp/download" "$url" ;;
  *) log "--url must start with https://, s3:// or file://"; exit 2 ;;
esac
echo "$sha256  $tmp/download" | sha256sum --check --quiet - \
  || { log "SHA-256 of $url is $(sha256sum "$tmp/download" | cut -d' ' -f1), not $sha256"; exit 1; }
if [[ $url == *.tar.gz || $url == *.tgz ]]; then
  tar -xzf "$tmp/download" -C "$tmp"
  bin=$(find "$tmp" -type f -name silt | head -1)
  [[ -n $bin ]] || { log "$url holds no file named silt"; exit 1; }
else
  bin=$tmp/download
fi
# Replace atomically: a running silt keeps the old file until it is restarted.
install -m 0755 "$bin" /usr/local/bin/silt.new
mv -f /usr/local/bin/silt.new /usr/local/bin/silt
log "installed $(/usr/local/bin/silt --version)"
