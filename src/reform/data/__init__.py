"""Offline haystacks and needles (layer 0 of docs/architecture.md): Python reference-manual prose frozen
into the package, so every machine builds the same inputs."""
