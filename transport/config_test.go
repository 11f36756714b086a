package transport

import (
	"testing"

	"github.com/mwrpc/mwrpc/transport/internal/wire"
	"github.com/mwrpc/mwrpc/transport/verbs"
	"github.com/mwrpc/mwrpc/transport/verbs/soft"
)

// TestConfigDefaultsByFabric: a device that reports a ReadCrossover (the soft TCP fabric)
// gets shared receives and slots grown to carry payloads up to it inside the SEND; any
// other keeps 16 KiB slots of its connections' own; what the user set is kept, and big
// slots never multiply with the connections (no shared receives, no growth).
func TestConfigDefaultsByFabric(t *testing.T) {
	tcpDev, _ := soft.OpenTCP("defaults")
	defer tcpDev.Close()
	inproc, _ := soft.NewFabric().Open("defaults")
	defer inproc.Close()
	tcp, in := tcpDev.Attr(), inproc.Attr()
	noSRQ := tcp
	noSRQ.MaxSRQ = 0
	const grown = 64<<10 + envelopeRoom
	for _, tc := range []struct {
		name                   string
		dev                    verbs.DeviceAttr
		cfg                    Config
		slot, eager, sharedRcv int
	}{
		{"tcp", tcp, Config{}, grown, grown - wire.HeaderLen, DefaultSharedReceives},
		{"in process", in, Config{}, DefaultSlotSize, DefaultEagerThreshold, 0},
		{"tcp, shared receives off", tcp, Config{SharedReceives: -1}, DefaultSlotSize, DefaultEagerThreshold, 0},
		{"tcp, no SRQs", noSRQ, Config{}, DefaultSlotSize, DefaultEagerThreshold, 0},
		{"tcp, slot size set", tcp, Config{SlotSize: 32 << 10}, 32 << 10, DefaultEagerThreshold, DefaultSharedReceives},
		{"tcp, eager threshold set", tcp, Config{EagerThreshold: 1 << 10}, grown, 1 << 10, DefaultSharedReceives},
		{"tcp, shared receives set", tcp, Config{SharedReceives: 64}, grown, grown - wire.HeaderLen, 64},
		{"in process, shared receives set", in, Config{SharedReceives: 64}, DefaultSlotSize, DefaultEagerThreshold, 64},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.cfg.withDefaults(tc.dev)
			if err != nil {
				t.Fatal(err)
			}
			if got.SlotSize != tc.slot || got.EagerThreshold != tc.eager || got.SharedReceives != tc.sharedRcv {
				t.Errorf("slot %d, eager %d, shared receives %d; want %d, %d, %d",
					got.SlotSize, got.EagerThreshold, got.SharedReceives, tc.slot, tc.eager, tc.sharedRcv)
			}
		})
	}
}

// TestSlotSizeIsAPoolClass: a slot size that is not a power of two gets a buffer class
// of its own, not the next power of two (a 66 KiB slot would take 128 KiB).
func TestSlotSizeIsAPoolClass(t *testing.T) {
	dev, _ := soft.OpenTCP("classes")
	defer dev.Close()
	tr, err := New(dev, nil, Config{Pollers: 1}) // one shared receive queue, whatever the cores
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	for _, c := range tr.Stats().Pool.Classes {
		if c.Size == tr.cfg.SlotSize {
			if c.BytesInUse != int64(tr.cfg.SharedReceives*tr.cfg.SlotSize) {
				t.Errorf("the %d shared slots hold %d bytes of their class, want %d", tr.cfg.SharedReceives, c.BytesInUse, tr.cfg.SharedReceives*tr.cfg.SlotSize)
			}
			return
		}
	}
	t.Errorf("no pool class of the slot size %d", tr.cfg.SlotSize)
}
