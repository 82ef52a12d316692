"""The results store's tables (kbench.results.store), and how a version 2 store is brought up
to this version in place."""

APPLICATION_ID = 0x6B62656E  # "kben": marks the file as kbench's
SCHEMA_VERSION = 3  # 2: per-side Measurements, compile baseline; 3: many problems a run

TABLES = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY,
    started TEXT NOT NULL,
    finished TEXT,                      -- NULL while running, or after a kill
    kbench_version TEXT NOT NULL,
    task TEXT NOT NULL,
    task_hash TEXT NOT NULL,
    seed INTEGER NOT NULL,
    device TEXT NOT NULL,
    fingerprint TEXT NOT NULL,          -- device, torch, CUDA, driver, nvcc, arch: what reuse needs
    options TEXT NOT NULL,              -- JSON: what --resume must repeat
    environment TEXT NOT NULL,          -- JSON
    notes TEXT NOT NULL DEFAULT '[]',   -- JSON
    reference TEXT,                     -- (store version 2: now in problems)
    copy_gbps REAL                      -- (store version 2: now in problems)
);
CREATE TABLE IF NOT EXISTS results (
    run_id INTEGER NOT NULL REFERENCES runs(id),
    name TEXT NOT NULL,
    problem TEXT NOT NULL DEFAULT '',   -- the task it was graded against
    sha256 TEXT NOT NULL,
    status TEXT NOT NULL,
    speedup REAL,
    graded TEXT NOT NULL,
    reused_from INTEGER,                -- the run it was copied from, when not graded again
    data TEXT NOT NULL,                 -- JSON SubmissionResult
    PRIMARY KEY (run_id, name)
);
CREATE INDEX IF NOT EXISTS results_by_file ON results (sha256, status);
CREATE INDEX IF NOT EXISTS results_by_name ON results (name);
""" + """
CREATE TABLE IF NOT EXISTS problems (
    run_id INTEGER NOT NULL REFERENCES runs(id),
    name TEXT NOT NULL,
    digest TEXT NOT NULL,               -- the task file's and its reference's
    data TEXT NOT NULL,                 -- JSON ProblemRun: notes, error, reference table
    PRIMARY KEY (run_id, name)
);
"""

# A store of version 2 (one task a run) gains the problems table; each run's reference becomes
# its one problem's, named after its task.
FROM_V2 = """
ALTER TABLE results ADD COLUMN problem TEXT NOT NULL DEFAULT '';
UPDATE results SET problem = (SELECT task FROM runs WHERE runs.id = results.run_id);
INSERT INTO problems (run_id, name, digest, data)
    SELECT id, task, task_hash, json_object('name', task, 'path', '', 'digest', task_hash,
        'error', NULL, 'notes', json('[]'), 'reference', json(coalesce(reference, '[]')),
        'copy_gbps', copy_gbps) FROM runs
"""
