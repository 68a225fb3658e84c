"""Semantics-Consistent Feature Search: the search op and its backends (reference, triton, cuda)."""

from scfs.search.api import SearchOutput, feature_search
from scfs.search.crops import random_feature_crops

__all__ = ["SearchOutput", "feature_search", "random_feature_crops"]
