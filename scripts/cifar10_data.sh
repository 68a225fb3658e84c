#!/usr/bin/env bash
# Sourced by the device scripts: `cifar10_ready` extracts the CIFAR-10 JPEG archive (ARCHIVE, default
# .gpudata/cifar10-jpeg.tar.xz, git-excluded; copy ../shared/data/cifar10-jpeg.tar.xz there) into data/cifar10 if
# it is not there yet, then decodes the tree into data/cifar10/.scfs_cache once, so that runs starting together do
# not each decode 60,000 JPEGs (scfs.data.datamodule.warm_cache). `cifar10_ready --no-cache` only extracts.
cifar10_ready() {
  local py=${PY:-python3}
  [ -d data/cifar10/train ] || $py -m scfs.data.prepare cifar10 --archive "${ARCHIVE:-.gpudata/cifar10-jpeg.tar.xz}" \
    --out data/cifar10 || return 1
  [ "${1:-}" = "--no-cache" ] && return 0
  $py -c "from scfs.data.datamodule import warm_cache; print(*warm_cache({'name': 'cifar10', 'root': 'data/cifar10'}, 16), sep='\n')"
}
