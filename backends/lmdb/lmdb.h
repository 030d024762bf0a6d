/* SPDX-License-Identifier: MIT */
/*
 * lmdb.h: the lmdb store (lmdb.c, lmdb_store_ops): every key group's
 * records in an LMDB environment of its own on disk, under the arena's
 * directory. Records handed out are private copies (shadows) that a
 * publish puts back. The owner of a key group writes in one transaction,
 * committed at each barrier, when it closes, and early when the
 * transaction grows big; other processes read what was last committed.
 */
#ifndef STASH_BACKENDS_LMDB_H
#define STASH_BACKENDS_LMDB_H

#include "backends/store/store.h"

/* A user's open transactions, charged their values and the pages each
 * change may copy, commit before their charges together pass this: a
 * bound on the dirty pages they hold in memory. */
#define LMDB_STORE_MAX_BYTES (256ull << 20)

/* commit_due commits if the last commit is LMDB_COMMIT_MS old or more. */
#define LMDB_COMMIT_MS 50u

#endif /* STASH_BACKENDS_LMDB_H */
