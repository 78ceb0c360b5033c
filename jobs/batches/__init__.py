"""The batch lifecycle's inputs and outputs: the files a batch reads and the uploads
that make them (``uploads``: a file sent in parts, composed in the object store into an
ordinary ``purpose=batch`` File), datasets read in place (``locations``, ``datasets``,
``views``) and written back as Parquet datasets (``exports``), reruns of what failed
(``retry``) and what expires (``retention``). The Files use cases (one multipart
``POST /v1/files``) are still ``jobs.batches.service``'s."""
