-- Read-only view of fingerprints over the live generations (contract: service/index/base.py).
-- KEYS[1] shard base; ARGV[1] current generation; ARGV[2] generations to read;
-- ARGV[3] common threshold; ARGV[4] bucket bits in shard; ARGV[5] records of 12 bytes:
-- position u32 (in the caller's array), fingerprint 8 bytes.
-- Returns, per fingerprint that has entries: position, entry count (-1 when common), then four
-- integers per entry: tenant, doc, offset, kinds.

local base = KEYS[1]
local cur = tonumber(ARGV[1])
local gens = tonumber(ARGV[2])
local common = tonumber(ARGV[3])
local divisor = 2 ^ (16 - tonumber(ARGV[4]))
local records = ARGV[5]

local out = {}
for r = 1, #records, 12 do
  local pos, fp = struct.unpack('>I4c8', records, r)
  local bucket = math.floor((string.byte(fp, 2) * 256 + string.byte(fp, 3)) / divisor)
  local merged, tenants, is_common = {}, {}, false
  for gen = cur - gens + 1, cur do
    local value = redis.call('HGET', base .. ':' .. gen .. ':' .. bucket, fp)
    if value == '*' then is_common = true break end
    if value then
      for i = 1, #value, 13 do
        local t, d, o, k = struct.unpack('>I4I4I4B', value, i)
        local e = merged[t]
        if e then e[3] = bit.bor(e[3], k) else merged[t] = {d, o, k}; tenants[#tenants + 1] = t end
      end
    end
  end
  if is_common or #tenants >= common then
    out[#out + 1] = pos
    out[#out + 1] = -1
  elseif #tenants > 0 then
    out[#out + 1] = pos
    out[#out + 1] = #tenants
    for _, t in ipairs(tenants) do
      local e = merged[t]
      out[#out + 1] = t
      out[#out + 1] = e[1]
      out[#out + 1] = e[2]
      out[#out + 1] = e[3]
    end
  end
end
return out
