//go:build !linux || !cgo

package rdmacore

import "unsafe"

// Load reports ErrNotSupported: this build cannot call rdma-core. Callers check
// Load first, so the functions below are never reached; they return the same error.
func Load() error { return ErrNotSupported }

func ListDevices() ([]DeviceInfo, error)             { return nil, ErrNotSupported }
func OpenDevice(string) (Context, error)             { return nil, ErrNotSupported }
func CloseDevice(Context) error                      { return ErrNotSupported }
func ContextDeviceName(Context) string               { return "" }
func NumCompVectors(Context) int                     { return 0 }
func ContextTransport(Context) int                   { return 0 }
func QueryDevice(Context) (DeviceAttr, error)        { return DeviceAttr{}, ErrNotSupported }
func QueryPort(Context, uint8) (PortAttr, error)     { return PortAttr{}, ErrNotSupported }
func QueryGID(Context, uint8, int) ([16]byte, error) { return [16]byte{}, ErrNotSupported }
func AllocPD(Context) (PD, error)                    { return nil, ErrNotSupported }
func DeallocPD(PD) error                             { return ErrNotSupported }
func RegMR(PD, unsafe.Pointer, int, int) (MR, uint32, uint32, error) {
	return nil, 0, 0, ErrNotSupported
}
func DeregMR(MR) error                                         { return ErrNotSupported }
func CreateCompChannel(Context) (CompChannel, int, error)      { return nil, -1, ErrNotSupported }
func DestroyCompChannel(CompChannel) error                     { return ErrNotSupported }
func CreateCQ(Context, int, CompChannel, int) (CQ, int, error) { return nil, 0, ErrNotSupported }
func DestroyCQ(CQ) error                                       { return ErrNotSupported }
func GetCQEvent(CompChannel) (CQ, error)                       { return nil, ErrNotSupported }
func AckCQEvents(CQ, int)                                      {}
func ReqNotifyCQ(CQ, bool) error                               { return ErrNotSupported }
func PollCQ(CQ, []WC) (int, error)                             { return 0, ErrNotSupported }
func QPNum(QP) uint32                                          { return 0 }
func PostSend(QP, []SendReq) (int, error)                      { return 0, ErrNotSupported }
func PostRecv(QP, []RecvReq) (int, error)                      { return 0, ErrNotSupported }
func CreateEventChannel() (EventChannel, int, error)           { return nil, -1, ErrNotSupported }
func DestroyEventChannel(EventChannel)                         {}
func CreateID(EventChannel) (CMID, error)                      { return nil, ErrNotSupported }
func DestroyID(CMID) error                                     { return ErrNotSupported }
func BindAddr(CMID, *Sockaddr) error                           { return ErrNotSupported }
func ResolveAddr(CMID, *Sockaddr, *Sockaddr, int) error        { return ErrNotSupported }
func ResolveRoute(CMID, int) error                             { return ErrNotSupported }
func Listen(CMID, int) error                                   { return ErrNotSupported }
func Connect(CMID, *ConnParam) error                           { return ErrNotSupported }
func Accept(CMID, *ConnParam) error                            { return ErrNotSupported }
func Reject(CMID, []byte) error                                { return ErrNotSupported }
func Disconnect(CMID) error                                    { return ErrNotSupported }
func MigrateID(CMID, EventChannel) error                       { return ErrNotSupported }
func GetCMEvent(EventChannel) (CMEvent, error)                 { return CMEvent{}, ErrNotSupported }
func AckCMEvent(CMEvent)                                       {}
func CreateSRQ(PD, int, int) (SRQ, int, error)                 { return nil, 0, ErrNotSupported }
func ArmSRQ(SRQ, int) error                                    { return ErrNotSupported }
func DestroySRQ(SRQ) error                                     { return ErrNotSupported }
func PostSRQRecv(SRQ, []RecvReq) (int, error)                  { return 0, ErrNotSupported }
func CreateQP(CMID, PD, CQ, CQ, SRQ, QPCap, bool) (QP, QPCap, error) {
	return nil, QPCap{}, ErrNotSupported
}
func DestroyQP(CMID)                            {}
func SetAckTimeout(CMID, uint8) error           { return ErrNotSupported }
func IDContext(CMID) Context                    { return nil }
func IDPortNum(CMID) uint8                      { return 0 }
func IDLocalAddr(CMID) *Sockaddr                { return new(Sockaddr) }
func IDPeerAddr(CMID) *Sockaddr                 { return new(Sockaddr) }
func AsyncFD(Context) int                       { return -1 }
func GetAsyncEvent(Context) (AsyncEvent, error) { return AsyncEvent{}, ErrNotSupported }
