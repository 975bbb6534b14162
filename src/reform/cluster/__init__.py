"""Beyond one machine (layer 5 of docs/architecture.md, "Beyond one process"; above ``reform.server``): ``encode`` turns a corpus into a store of saved
contexts, in one process or as one Ray task per document on a pool of model-loading actors; ``serve``
runs ``reform serve``'s OpenAI-compatible app as Ray Serve replicas over one shared store. Ray is an
optional extra (``pip install 'reform-longcontext[ray]'``), imported only when used."""
