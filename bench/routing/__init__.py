"""`kvgate bench routing`: routers side by side on a simulated fleet."""
