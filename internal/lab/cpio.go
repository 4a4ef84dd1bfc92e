//go:build linux

package lab

import (
	"fmt"
	"io"
	"io/fs"
	"syscall"
)

// cpioWriter writes an archive in the SVR4 "newc" cpio format, the only one the
// kernel accepts for an initramfs. Entries carry no timestamps or owners (all
// root), so the same inputs always give the same bytes.
type cpioWriter struct {
	w   io.Writer
	ino uint32
	off int64 // bytes written so far, for 4-byte alignment
	err error // first write error; later calls do nothing
}

func newCPIOWriter(w io.Writer) *cpioWriter { return &cpioWriter{w: w} }

// Dir adds a directory. Parents must be added before their children.
func (c *cpioWriter) Dir(name string, perm fs.FileMode) {
	c.entry(name, syscall.S_IFDIR|uint32(perm.Perm()), 0, 0, nil)
}

// File adds a regular file with the given contents.
func (c *cpioWriter) File(name string, perm fs.FileMode, data []byte) {
	c.entry(name, syscall.S_IFREG|uint32(perm.Perm()), 0, 0, data)
}

// Symlink adds a symbolic link name pointing to target.
func (c *cpioWriter) Symlink(name, target string) {
	c.entry(name, syscall.S_IFLNK|0o777, 0, 0, []byte(target))
}

// CharDev adds a character device node; writing it needs no privileges,
// unlike mknod, which is why the archive carries /dev/console itself.
func (c *cpioWriter) CharDev(name string, perm fs.FileMode, major, minor uint32) {
	c.entry(name, syscall.S_IFCHR|uint32(perm.Perm()), major, minor, nil)
}

// Close writes the trailer entry. It does not close the underlying writer.
func (c *cpioWriter) Close() error {
	c.ino = 0 // the trailer conventionally has inode 0
	c.entry("TRAILER!!!", 0, 0, 0, nil)
	return c.err
}

func (c *cpioWriter) entry(name string, mode, rdevMajor, rdevMinor uint32, data []byte) {
	if c.err != nil {
		return
	}
	if name != "TRAILER!!!" {
		c.ino++
	}
	nlink := 1
	if mode&syscall.S_IFMT == syscall.S_IFDIR {
		nlink = 2
	}
	// Fields: magic, ino, mode, uid, gid, nlink, mtime, filesize, devmajor,
	// devminor, rdevmajor, rdevminor, namesize (with its NUL), check.
	hdr := fmt.Sprintf("070701%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x",
		c.ino, mode, 0, 0, nlink, 0, len(data), 0, 0, rdevMajor, rdevMinor, len(name)+1, 0)
	c.write([]byte(hdr))
	c.write([]byte(name + "\x00"))
	c.pad()
	c.write(data)
	c.pad()
}

func (c *cpioWriter) write(b []byte) {
	if c.err != nil {
		return
	}
	n, err := c.w.Write(b)
	c.off += int64(n)
	c.err = err
}

// pad aligns the output to 4 bytes, as newc requires after names and data.
func (c *cpioWriter) pad() {
	if r := c.off % 4; r != 0 {
		c.write(make([]byte, 4-r))
	}
}
