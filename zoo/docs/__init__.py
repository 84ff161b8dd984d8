"""The documentation site's generated pages (`python -m zoo.docs.catalogue`) and its MkDocs
hook (`zoo.docs.hooks`: the benchmark results as pages)."""
