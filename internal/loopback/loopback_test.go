package loopback

import "testing"

// TestRequire binds the one loopback address every OS has: Require neither skips nor
// fails for it (a skip would show in -v as SKIP, a failure as FAIL).
func TestRequire(t *testing.T) {
	Require(t, "127.0.0.1")
}
