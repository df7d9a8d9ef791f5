"""Reports: revenue where it was earned, margins, scheduled margin reports, and FX
into the reporting currency."""
