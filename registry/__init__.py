"""The model store: catalog, GGUF metadata, content-addressed blobs, pulls and imports.

Import from the submodules (`registry.store`, `registry.catalog`, `registry.gguf`,
`registry.pull`, `registry.errors`); this package never imports `actors` or `blazar`.
"""

__all__: list[str] = []
