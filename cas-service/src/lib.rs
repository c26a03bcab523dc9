//! The UniCAS HTTP service: the data plane `/v1/cas/*`, the admin plane `/admin/*`, capability auth, the metadata and blob storage ports, and garbage collection.
