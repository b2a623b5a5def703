"""Writers: ingest, put, rm, bulk loads, and the paced walk of a bucket."""
