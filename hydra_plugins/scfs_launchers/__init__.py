"""Hydra plugins shipped with scfs: the study sweeper (`hydra/sweeper=study`, the default of `conf/config.yaml`)
and the launcher for the GPUs of one machine (`hydra/launcher=local_gpus`). Hydra finds them in the `hydra_plugins`
namespace package."""
