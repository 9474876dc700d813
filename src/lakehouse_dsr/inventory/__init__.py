"""The data map against the lake: whether every mapped table and column exists with a usable type
(`check`), and which columns that probably hold personal data it misses (`discover`). Above the
lake and the pure data-map model (`datamap`), which knows no catalog."""
