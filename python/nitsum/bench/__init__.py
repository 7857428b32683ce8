"""`nitsum bench`: trace-replay load generator and goodput reports."""
