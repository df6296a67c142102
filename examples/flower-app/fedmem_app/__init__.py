"""fedmem-flower-app: memory shards as Flower ClientApps behind fedmem's gateway."""
