-- Read-only view of fingerprints over the live generations (contract: service/index/base.py).
-- KEYS[1] shard base; ARGV[1] current generation; ARGV[2] generations to read;
-- ARGV[3] common: tenants with it in a prompt; ARGV[4] common: tenants with it at all;
-- ARGV[5] bucket bits in shard; ARGV[6] records of 12 bytes: position u32 (in the caller's
-- array), fingerprint 8 bytes.
-- Returns, per fingerprint that has entries: position, entry count (-1 when common), then four
-- integers per entry: tenant, doc, offset, kinds.

local base = KEYS[1]
local cur = tonumber(ARGV[1])
local gens = tonumber(ARGV[2])
local common_prompt = tonumber(ARGV[3])
local common_any = tonumber(ARGV[4])
local divisor = 2 ^ (16 - tonumber(ARGV[5]))
local records = ARGV[6]
local PROMPT, RESPONSE = 1, 2

local out = {}
for r = 1, #records, 12 do
  local pos, fp = struct.unpack('>I4c8', records, r)
  local bucket = math.floor((string.byte(fp, 2) * 256 + string.byte(fp, 3)) / divisor)
  local merged, tenants, common = {}, {}, false
  for gen = cur - gens + 1, cur do
    local value = redis.call('HGET', base .. ':' .. gen .. ':' .. bucket, fp)
    if value == '*' then common = true break end
    if value then
      for i = 1, #value, 13 do
        local t, d, o, k = struct.unpack('>I4I4I4B', value, i)
        local e = merged[t]
        if e then
          if e[3] == RESPONSE and bit.band(k, PROMPT) == PROMPT then e[1] = d; e[2] = o end
          e[3] = bit.bor(e[3], k)
        else
          merged[t] = {d, o, k}; tenants[#tenants + 1] = t
        end
      end
    end
  end
  local senders = 0
  for _, t in ipairs(tenants) do
    if bit.band(merged[t][3], PROMPT) == PROMPT then senders = senders + 1 end
  end
  if common or senders >= common_prompt or #tenants >= common_any then
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
