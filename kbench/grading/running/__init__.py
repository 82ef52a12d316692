"""Running: one submission from load to verdict, the executors that place jobs (this device,
every GPU of the host, a Ray cluster), and the driver that alone writes the store."""
