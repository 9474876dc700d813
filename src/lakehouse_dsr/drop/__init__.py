"""California's DROP (Delete Request and Opt-out Platform): its downloads of hashed deletion lists,
the standardization and hashing that match them to the lake, and the answers uploaded every cycle."""
