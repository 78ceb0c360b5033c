"""The batch lifecycle's inputs: the files a batch reads and the uploads that make them.
``uploads`` is the Uploads API (a file sent in parts, each stored as an object of its
own, then composed in the object store into an ordinary ``purpose=batch`` File); the
Files use cases (one multipart ``POST /v1/files``) are still ``jobs.service``'s."""
