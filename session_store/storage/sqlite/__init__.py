"""SQLite: the store's dialect (dialect.py) and its committer (committer.py), which commits
(commit.py) in its writer process (child.py, driven by writer.py) or inline on the event
loop's thread (inline.py); the commit's SQL (statements.py) and the database file's checks
(files.py).

Nothing is imported here: the writer process runs `child` with sqlite3 and the batch planner
only, without SQLAlchemy.
"""
