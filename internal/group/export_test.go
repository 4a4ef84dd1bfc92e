package group

import "fmt"

// ArmedStreamsError checks each link's count of armed streams
// (armedStreams, which lets it rest) against its streams' own flags.
func (m *Mux) ArmedStreamsError() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, l := range m.links {
		n := 0
		for _, s := range m.slots {
			if s != nil && s.l == l && s.armed {
				n++
			}
		}
		if n != l.armedStreams {
			return fmt.Errorf("link %s: %d streams armed, its count says %d", l.name(), n, l.armedStreams)
		}
	}
	return nil
}
