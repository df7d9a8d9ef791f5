from django.db import migrations

from audit.triggers import tables_joined


class Migration(migrations.Migration):
    """The sites' grid intensities join the audited fleet facts."""

    dependencies = [
        ("audit", "0003_tax"),
        ("serving", "0014_grid_intensity"),
    ]

    operations = [tables_joined(("serving_gridintensity",))]
