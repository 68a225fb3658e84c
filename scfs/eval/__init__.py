"""Evaluation: kNN on faiss, linear probe, reports."""
