import socket,time,json,threading,re,urllib.request
PORT=18905
def metric():
    t=urllib.request.urlopen(f"http://127.0.0.1:{PORT}/metrics").read().decode()
    return re.search(r"^lorasink_queue_bytes (\S+)",t,re.M).group(1)
def body(T):
    return json.dumps({"x":[[0.5]*64 for _ in range(T)]}).encode()
def send(head, parts, delay=0, wait=10):
    s=socket.create_connection(("127.0.0.1",PORT)); s.settimeout(wait)
    s.sendall(head)
    for p in parts:
        s.sendall(p); time.sleep(delay)
    return s
def recv(s):
    out=b""
    try:
        while True:
            b=s.recv(65536)
            if not b: break
            out+=b
            if b"\r\n\r\n" in out:
                h,_,rest=out.partition(b"\r\n\r\n")
                m=re.search(rb"Content-Length: (\d+)",h)
                if m and len(rest)>=int(m.group(1)): break
    except Exception as e: out+=b"<<"+str(e).encode()+b">>"
    return out.decode("latin1")
def short(r):
    st=r.split("\r\n")[0]; m=re.search(r'"message":"([^"]*)"',r); c="Connection: close" in r; ra=re.search(r"Retry-After: \S+",r)
    return f"{st} | close={c} | {ra.group(0) if ra else ''} | {m.group(1) if m else r[-80:]}"
# 1. alone big request
b=body(3000); print("body MB", len(b)/2**20)
s=send(f"POST /forward HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(b)}\r\nConnection: close\r\n\r\n".encode(), [b])
print("alone:", short(recv(s)))
# 2. trickle one body of 800KB; watch metric
b1=body(800*1024//(len(body(1))) )
print("b1 KB",len(b1)//1024)
s1=socket.create_connection(("127.0.0.1",PORT)); s1.settimeout(30)
s1.sendall(f"POST /forward HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(b1)}\r\nConnection: close\r\n\r\n".encode())
time.sleep(0.3); print("head only, queue_bytes", metric())
s1.sendall(b1[:600*1024]); time.sleep(0.5); print("600KB sent, queue_bytes", metric())
# 3. second with CL 600KB → refused from head?
b2=body(600*1024//len(body(1)))
s2=socket.create_connection(("127.0.0.1",PORT)); s2.settimeout(5)
s2.sendall(f"POST /forward HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(b2)}\r\n\r\n".encode())
print("second CL head:", short(recv(s2)))
# 4. chunked
s3=socket.create_connection(("127.0.0.1",PORT)); s3.settimeout(10)
s3.sendall(b"POST /forward HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n")
for i in range(0,len(b2),65536):
    c=b2[i:i+65536]; s3.sendall(b"%x\r\n"%len(c)+c+b"\r\n")
time.sleep(0.3); print("after chunks sent (no terminator), resp?")
s3.settimeout(1)
try: print("early:", s3.recv(100))
except Exception as e: print("no early answer", e)
s3.settimeout(10); s3.sendall(b"0\r\n\r\n"); print("chunked:", short(recv(s3)))
s1.sendall(b1[600*1024:]); print("first:", short(recv(s1)))
print("end queue_bytes", metric())
