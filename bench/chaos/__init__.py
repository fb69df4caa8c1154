"""`kvgate bench chaos` and the fleet/traffic/fault pieces `kvgate bench soak` reuses."""
