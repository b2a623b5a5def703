"""The basics every layer uses: errors, files, processes, configuration, formats, placement, manifests."""
