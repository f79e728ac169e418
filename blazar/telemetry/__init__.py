"""What the daemon tells about the requests it served: metrics, quantiles, the audit log."""
