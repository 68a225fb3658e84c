"""Networks: the timm backbone wrapper, the DINO projection head and the per-stage search heads."""

from scfs.models.backbone import STAGE_NAMES, Backbone
from scfs.models.heads import DINOHead, StageHead
from scfs.models.vit import ViTBackbone

__all__ = ["STAGE_NAMES", "Backbone", "DINOHead", "StageHead", "ViTBackbone"]
