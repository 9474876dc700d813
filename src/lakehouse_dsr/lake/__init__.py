"""The lake as the engine sees it: Spark session and jars, the table handles (the format seam: Iceberg,
Delta), data skipping, layout, plain files, costs."""
