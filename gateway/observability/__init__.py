"""Metrics, histograms and log lines."""
