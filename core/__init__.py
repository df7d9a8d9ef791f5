"""core: the ground every app may import, and that imports no app of the
project (import-linter holds it). It has the service-error base classes
and the API's one error shape (errors, api_errors), the checked range of
API datetimes (api_time), fixed-point decimals in exports (fixed_point),
the database helpers (db_copy: COPY in, db_frames: frames out, csv_stream),
process management (processes), calendar maths in UTC (calendar: months,
anchored monthly periods), PostgreSQL advisory locks (locks), the form
fields the pages of every app share (forms: a UTC day), and the
record of how each background job last ended (models, signals), so a
scheduled job that stopped is seen."""
