"""The lake as the engine sees it: Spark session, the Iceberg seam, connectors, layout, costs."""
