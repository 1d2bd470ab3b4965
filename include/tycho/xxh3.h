/* XXH3-64 for KV blocks: libxxhash's run-time dispatch (AVX2 / AVX-512 where the CPU has them)
 * on x86-64, which the plain XXH3_64bits of Debian's build lacks (SSE2 only). Same hash values;
 * 1 MiB blocks hash ~1.5x faster from DRAM and several times faster from cache here. Include
 * this instead of <xxhash.h> where block-sized buffers are hashed. */
#ifndef TYCHO_XXH3_H
#define TYCHO_XXH3_H

#include <xxhash.h>
#if defined(__x86_64__) && defined(__has_include)
#if __has_include(<xxh_x86dispatch.h>)
#include <xxh_x86dispatch.h> /* maps XXH3_64bits & co to their _dispatch forms */
#endif
#endif

#endif
