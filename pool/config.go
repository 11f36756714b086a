package pool

import (
	"fmt"
	"log/slog"
	"math/bits"
	"os"
	"runtime"
	"slices"

	"github.com/mwrpc/mwrpc/transport/verbs"
)

// Defaults for the zero fields of a Config.
const (
	DefaultMinSize  = 256       // smallest default class
	DefaultMaxSize  = 16 << 20  // largest default class
	DefaultSlabSize = 1 << 20   // bytes per slab, at least one buffer of the class
	DefaultMaxBytes = 256 << 20 // registered bytes in all classes together
	hugePageSize    = 2 << 20   // slabs on huge pages are mapped in multiples of this
	maxClasses      = 64        // more classes than this is a configuration mistake
	maxBufferSize   = 1 << 30   // the largest class: SGE lengths are 32 bits, keep far below
	defaultAccess   = verbs.AccessLocalWrite | verbs.AccessMWBind
)

// MemlockPolicy says how a Pool accounts its registered bytes against RLIMIT_MEMLOCK.
type MemlockPolicy uint8

// Memlock policies.
const (
	// MemlockAuto checks the limit the way the kernel checks ibv_reg_mr: only when the
	// limit is finite and the calling thread lacks CAP_IPC_LOCK (root normally has it).
	MemlockAuto MemlockPolicy = iota
	// MemlockEnforce checks the limit even with CAP_IPC_LOCK, to see on a privileged
	// development machine the failure an unprivileged deployment would hit.
	MemlockEnforce
	// MemlockIgnore skips the pool's own check; only the provider (or mlock, with
	// Config.Lock) can then refuse memory.
	MemlockIgnore
)

// String returns "auto", "enforce" or "ignore".
func (m MemlockPolicy) String() string {
	switch m {
	case MemlockAuto:
		return "auto"
	case MemlockEnforce:
		return "enforce"
	case MemlockIgnore:
		return "ignore"
	}
	return fmt.Sprintf("MemlockPolicy(%d)", uint8(m))
}

// Config configures a Pool. The zero value is usable: default classes, 1 MiB slabs, a
// 256 MiB cap, LOCAL_WRITE|MW_BIND access.
type Config struct {
	// Access is what every slab's memory region is registered with. Zero means
	// AccessLocalWrite|AccessMWBind: the NIC may write the buffers (receives, READ
	// targets) and type-2 windows may expose them, but the region's own rkey grants peers
	// nothing. Add AccessRemoteRead or AccessRemoteWrite only if peers are to use the
	// region's rkey directly.
	Access verbs.Access

	// Classes are the buffer sizes, in bytes, strictly ascending. Empty means the powers
	// of two from DefaultMinSize to DefaultMaxSize. Get(n) takes the smallest class that
	// holds n bytes.
	Classes []int

	// SlabSize is the target size of one slab (one mapping, one memory region). A slab
	// holds the largest power-of-two count of buffers that fits, and at least one. Zero
	// means DefaultSlabSize.
	SlabSize int

	// MaxBytes caps the registered bytes of all classes together. Zero means
	// DefaultMaxBytes.
	MaxBytes int64

	// MaxClassBytes, if positive, also caps each class, so that one busy class cannot take
	// the whole of MaxBytes.
	MaxClassBytes int64

	// Prealloc is the number of slabs each class registers in New. Zero registers lazily,
	// on a class's first Get.
	Prealloc int

	// HugePages maps slabs with MAP_HUGETLB (in multiples of 2 MiB). When the system has
	// no huge pages to give, and on every OS but Linux, the pool logs a warning once and
	// uses normal pages.
	HugePages bool

	// Lock calls mlock on every slab (VirtualLock on Windows), so its pages are resident
	// before the provider sees them. A software provider does not pin memory; with Lock
	// the process really holds it locked, and the kernel's own RLIMIT_MEMLOCK check
	// applies as well (on Windows, the working-set quota).
	Lock bool

	// Memlock chooses how the pool checks RLIMIT_MEMLOCK before registering a slab.
	Memlock MemlockPolicy

	// TrackLeaks records the call stack of every Get (a few hundred nanoseconds and one
	// allocation per Get), for CheckLeaks and Close to name who took a buffer that was
	// never released. It is always on in a debug build.
	TrackLeaks bool

	// Shards is the number of free lists per class, rounded up to a power of two (at most
	// 256). A goroutine uses the shard its stack address hashes to, so two goroutines
	// running at once contend on a free list with a probability of about 1/Shards. Zero
	// means 8*GOMAXPROCS; 1 gives a single lock-free stack per class.
	Shards int

	// Logger receives the pool's warnings (the huge-page fallback, a cap beyond
	// RLIMIT_MEMLOCK). Nil means slog.Default().
	Logger *slog.Logger
}

// normalize validates cfg and fills in defaults. It returns a copy.
func (cfg Config) normalize() (Config, error) {
	if cfg.Access == 0 {
		cfg.Access = defaultAccess
	}
	if len(cfg.Classes) == 0 {
		for s := DefaultMinSize; s <= DefaultMaxSize; s <<= 1 {
			cfg.Classes = append(cfg.Classes, s)
		}
	} else {
		cfg.Classes = slices.Clone(cfg.Classes)
	}
	if len(cfg.Classes) > maxClasses {
		return cfg, fmt.Errorf("pool: %d classes, at most %d", len(cfg.Classes), maxClasses)
	}
	for i, s := range cfg.Classes {
		if s <= 0 || s > maxBufferSize {
			return cfg, fmt.Errorf("pool: class %d: size %d outside 1..%d", i, s, maxBufferSize)
		}
		if i > 0 && s <= cfg.Classes[i-1] {
			return cfg, fmt.Errorf("pool: classes must be strictly ascending: %d after %d", s, cfg.Classes[i-1])
		}
	}
	if cfg.SlabSize == 0 {
		cfg.SlabSize = DefaultSlabSize
	}
	if cfg.SlabSize < 0 {
		return cfg, fmt.Errorf("pool: negative SlabSize %d", cfg.SlabSize)
	}
	if cfg.MaxBytes == 0 {
		cfg.MaxBytes = DefaultMaxBytes
	}
	if cfg.MaxBytes < 0 || cfg.MaxClassBytes < 0 || cfg.Prealloc < 0 || cfg.Shards < 0 {
		return cfg, fmt.Errorf("pool: negative MaxBytes, MaxClassBytes, Prealloc or Shards")
	}
	if cfg.Memlock > MemlockIgnore {
		return cfg, fmt.Errorf("pool: unknown memlock policy %v", cfg.Memlock)
	}
	if cfg.Shards == 0 {
		cfg.Shards = 8 * runtime.GOMAXPROCS(0)
	}
	cfg.Shards = 1 << bits.Len(uint(cfg.Shards-1)) // round up to a power of two
	if cfg.Shards > 256 {
		cfg.Shards = 256
	}
	if debug {
		cfg.TrackLeaks = true
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return cfg, nil
}

// slabGeometry returns how many buffers of size a slab holds and how many bytes it maps.
func (cfg *Config) slabGeometry(size int) (count, mapBytes int) {
	page := os.Getpagesize()
	if cfg.HugePages {
		page = hugePageSize
	}
	target := max(cfg.SlabSize, size)
	target = (target + page - 1) / page * page
	count = 1 << (bits.Len(uint(target/size)) - 1) // largest power of two that fits
	mapBytes = (count*size + page - 1) / page * page
	return count, mapBytes
}
