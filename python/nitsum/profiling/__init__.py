"""Offline performance profiles: measured (`nitsum profile`) and analytic (roofline)."""
