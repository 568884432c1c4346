"""${message}

Revision ID: ${up_revision}
Revises: ${down_revision | comma,n}
Create Date: ${create_date}

"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
${imports if imports else ""}

# tunesvc numbers its revisions "0001", "0002", ... (alembic revision --rev-id NNNN); each one
# writes its number to tunesvc_meta.schema_version, and models.SCHEMA_VERSION is the head's number
revision = ${repr(up_revision)}
down_revision = ${repr(down_revision)}
branch_labels = ${repr(branch_labels)}
depends_on = ${repr(depends_on)}


def _schema_version(value: int) -> None:
    op.execute(sa.text("UPDATE tunesvc_meta SET value = :v WHERE key = 'schema_version'").bindparams(v=str(value)))


def upgrade() -> None:
    ${upgrades if upgrades else "pass"}
    _schema_version(int(revision))


def downgrade() -> None:
    ${downgrades if downgrades else "pass"}
    _schema_version(int(down_revision))
